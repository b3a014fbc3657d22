"""Engine: a model, its context and one KVMem session behind a small API.

This is what the chat layer, the server, the CLI and the benchmarks call.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace

import llama_cpp
import numpy as np

from kvmem.engine_settings import EngineSettings
from kvmem.errors import ConfigError, InvalidRequestError
from kvmem.gguf.model_path import resolve_model_path
from kvmem.memory.planner import RetrievalMethod
from kvmem.memory.raw_query import raw_prompt_spans
from kvmem.memory.retrieval_index import KeyGeometry, RetrievalIndex, default_score_layers
from kvmem.memory.spans import PromptSpans
from kvmem.memory.tiered_store import MIB, TieredStore
from kvmem.sampling import SamplingParams

from .build import EngineParts, build_contexts, build_session
from .llama.model import LlamaModel, ModelInfo
from .llama.sampler import Sampler
from .media.media import VisionProjector
from .persist.conversation_disk import ConversationDisk
from .persist.conversation_ids import ConversationIds, ConversationSummary
from .persist.conversations import ConversationPool
from .persist.session_persist import SessionPersister, open_tiered_store, store_fingerprint
from .query.background_index import BackgroundIndex
from .query.scoring_context import ScoringContext
from .retrieval_parts import background_index, retrieval_parts
from .session.session import KVMemSession
from .session.window import TokenSpan
from .spec.mtp_draft import MtpDrafter
from .trace import EngineStats, PrefillProgress, Tracer, TurnStats, tier_gauges
from .transfer.rpc_traffic import NetworkMeter
from .transfer.transfer_profile import PathTiming, TransferPath

logger = logging.getLogger(__name__)


class Engine:
    """Loads a model once and serves one KVMem session on it."""

    def __init__(
        self, settings: EngineSettings, trace_stream=None, *, model: LlamaModel | None = None
    ) -> None:
        """`model`: weights loaded already and shared (a lane of `EngineLanes`); the
        engine then makes only its own context and session, and leaves the model open."""
        settings.validate()
        self.settings = settings
        kv = settings.kvmem
        pooled_disk = kv.conversations > 1 and kv.disk_dir is not None
        self.tracer = Tracer(kv.trace, trace_stream)
        # --kvmem-disk-dir is locked first: one store, or one per conversation slot
        self.conv_disk = ConversationDisk(kv, self.tracer) if pooled_disk else None
        self.disk_store = None if pooled_disk else open_tiered_store(kv)
        self.persister: SessionPersister | None = None
        self._owns_model = model is None
        if model is None:
            path = resolve_model_path(settings.model_path)
            model = LlamaModel(
                path,
                settings.n_gpu_layers,
                settings.placement,
                load_mtp=settings.spec.wants_mtp,
                load_mode=settings.load_mode,
            )
        self.model = model
        self._check_hybrid(settings)
        train_ctx = llama_cpp.llama_model_n_ctx_train(self.model.ptr)
        n_ctx = settings.n_ctx or train_ctx
        self.info: ModelInfo = self.model.describe(n_ctx)
        cells = min(kv.gpu_cells, n_ctx) if kv.enabled else n_ctx
        retrieval = retrieval_parts(settings, self.info)
        self.key_geometry: KeyGeometry | None = retrieval.geometry
        index, capture = retrieval.index, retrieval.capture
        self._capture = capture
        contexts = build_contexts(self.model, settings, cells, capture)
        self.ctx = contexts.ctx
        self._main_capture = contexts.main_capture
        self.scoring: ScoringContext | None = contexts.scoring
        self.vision: VisionProjector | None = contexts.vision
        self.mtp: MtpDrafter | None = contexts.mtp
        self._parts = EngineParts(
            contexts, kv, n_ctx, self.tracer, self.is_eog, settings.staging_bytes, settings.spec
        )
        store = self.disk_store  # (a TieredStore is falsy while empty: compare with None)
        if self.conv_disk is not None:
            store = self.conv_disk.open_store(0)
        self.session = build_session(self._parts, index, store)
        self._meter_network(self.session)
        if self.disk_store is not None:
            self._load_stored_session(index)
        self.pool: ConversationPool | None = None
        if kv.conversations > 1:
            if self.conv_disk is not None:
                self.conv_disk.fingerprint = self._fingerprint(index)
            self.pool = ConversationPool(
                kv.conversations,
                self.session,
                self._new_session,
                self.tracer,
                disk=self.conv_disk,
                cap_bytes=kv.conversations_mib * MIB,
            )
        self.names = ConversationIds(self.pool)
        self.conversation_id: str | None = None  # the next turn's (use_conversation)
        self.stats = EngineStats(gpu_cells_max=self.session.capacity)
        self._eog: tuple[int, ...] | None = None
        logger.info(
            "engine ready: %s, n_ctx=%d, gpu cells=%d, kvmem=%s",
            self.info.name,
            n_ctx,
            self.session.capacity,
            kv.enabled,
        )

    def _check_hybrid(self, settings: EngineSettings) -> None:
        """A hybrid model's recurrent state lives in the context only: it is neither written
        to --kvmem-disk-dir nor switched between conversations, so those are refused."""
        kv = settings.kvmem
        flag = "--kvmem-disk-dir" if kv.disk_dir else "--kvmem-conversations"
        if self.model.is_hybrid and (kv.disk_dir or kv.conversations > 1):
            if self._owns_model:
                self.model.close()
            if self.disk_store is not None:
                self.disk_store.close()
            raise ConfigError(
                flag,
                "not supported for hybrid (recurrent) models yet: the recurrent state is "
                "neither persisted nor switched between conversations",
            )

    def _new_session(self, slot: int) -> KVMemSession:
        """Another conversation on this context (--kvmem-conversations); with a disk dir
        its store is DIR/conversation-<slot>."""
        kv, index = self.settings.kvmem, None
        if self.key_geometry is not None and kv.method is RetrievalMethod.RETRIEVAL:
            layers = kv.score_layers or default_score_layers(self.info.n_layer)
            index = background_index(self.key_geometry, layers)
        store = self.conv_disk.open_store(slot) if self.conv_disk is not None else None
        session = build_session(self._parts, index, store)
        self._meter_network(session)
        return session

    def _meter_network(self, session: KVMemSession) -> None:
        """With --rpc, the session's transfer profile counts the bytes to the workers."""
        if self.settings.placement.rpc:
            session.transfer.profile.network = NetworkMeter(self.settings.placement.rpc)

    def _fingerprint(self, index: RetrievalIndex | None) -> dict[str, str]:
        geometry = self.key_geometry
        return store_fingerprint(
            self.info,
            self.settings.kvmem,
            self.settings.cache_types,
            self.settings.flash_attn,
            geometry.k_rotation if geometry is not None else 0,
            index.layers if index is not None else (),
        )

    def _load_stored_session(self, index: RetrievalIndex | None) -> None:
        assert self.disk_store is not None
        fingerprint = self._fingerprint(index)
        self.persister = SessionPersister(self.session, self.disk_store, fingerprint, self.tracer)
        self.persister.load()

    # text ------------------------------------------------------------------------------
    def tokenize(
        self, text: str, *, add_special: bool = False, parse_special: bool = True
    ) -> list[int]:
        return self.model.tokenize(text, add_special, parse_special)

    def image_items(self, digest: str, width: int, height: int, rgb: bytes) -> list[int]:
        """An RGB image's prompt items (text ids and image-row stand-ins), encoded once per
        content hash `digest`; InvalidRequestError without a projector."""
        if self.vision is None:
            raise InvalidRequestError(
                "image input is not supported: no vision projector is loaded", "messages"
            )
        return list(self.vision.encode(digest, width, height, rgb).items)

    def check_grammar(self, grammar: str) -> None:
        """InvalidRequestError(param=grammar) unless llama.cpp parses `grammar`."""
        Sampler.check_grammar(self.model.vocab, grammar)

    def token_bytes(self, token: int) -> bytes:
        return self.model.piece(token, special=False)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.token_bytes(t) for t in tokens).decode("utf-8", "replace")

    def eog_tokens(self) -> tuple[int, ...]:
        """Every end-of-generation token of the vocabulary (banned by ignore_eos)."""
        if self._eog is None:
            vocab = self.model.vocab
            self._eog = tuple(
                t for t in range(self.info.n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t)
            )
        return self._eog

    def is_eog(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self.model.vocab, token))

    # turns -----------------------------------------------------------------------------
    def generate(
        self,
        prompt: Sequence[int],
        *,
        query: PromptSpans | TokenSpan | None = None,
        sampling: SamplingParams | None = None,
        max_tokens: int = -1,
        grammar: str | None = None,
        cancel: threading.Event | None = None,
        logits_out: list[np.ndarray] | None = None,
        ignore_eos: bool = False,
        banned_tokens: Sequence[int] = (),
        progress: Callable[[PrefillProgress], None] | None = None,
    ) -> Iterator[int]:
        sampling = sampling or SamplingParams()
        banned = tuple(banned_tokens) + (self.eog_tokens() if ignore_eos else ())
        if sampling.seed < 0 and self.settings.seed >= 0:
            sampling = _with_seed(sampling, self.settings.seed)
        self._route(prompt)
        try:
            yield from self.session.generate(
                prompt,
                query=self._spans(prompt, query),
                sampling=sampling,
                max_tokens=max_tokens,
                grammar=grammar,
                cancel=cancel,
                logits_out=logits_out,
                banned_tokens=banned,
                progress=progress,
            )
        finally:
            self._account(self.session.last_turn)
            self._persist()

    def teacher_force(
        self,
        prompt: Sequence[int],
        continuation: Sequence[int],
        *,
        query: PromptSpans | TokenSpan | None = None,
    ) -> np.ndarray:
        self._route(prompt)
        try:
            return self.session.teacher_force(
                prompt, continuation, query=self._spans(prompt, query)
            )
        finally:
            self._account(self.session.last_turn)
            self._persist()

    # conversations a client names ---------------------------------------------------------
    def use_conversation(self, name: str | None) -> None:
        """The next turn runs on the conversation `name` (None: routed by its prefix)."""
        self.conversation_id = name

    def _route(self, prompt: Sequence[int]) -> None:
        name, self.conversation_id = self.conversation_id, None
        self.session = self.names.route(prompt, name, self.session)

    def holds_conversation(self, name: str) -> bool:
        return self.names.holds(name)

    def conversation(self, name: str) -> ConversationSummary | None:
        return self.names.describe(name, self.session)

    def drop_conversation(self, name: str) -> int | None:
        """Forget the conversation `name`: the host bytes freed (None: not held here)."""
        freed = self.names.drop(name, self.session)
        if freed is not None:
            self._persist()
            self._account_stores()
        return freed

    def _spans(
        self, prompt: Sequence[int], query: PromptSpans | TokenSpan | None
    ) -> PromptSpans | TokenSpan | None:
        """The caller's spans; for a raw prompt of text (none given), its last paragraph
        as the query and its tail as the live span (memory.raw_query). A tail holding image
        stand-ins (ids outside the vocabulary) keeps the tail as the query."""
        n_tail, n_vocab = self.settings.kvmem.query_max_tokens, self.info.n_vocab
        tail = prompt[-n_tail:]
        if query is not None or not prompt or not all(0 <= t < n_vocab for t in tail):
            return query
        return raw_prompt_spans(prompt, self.token_bytes, n_tail)

    def _persist(self) -> None:
        """Checkpoint the session to --kvmem-disk-dir (queued behind the block writes);
        with conversations, the active one, then the pool's memory cap."""
        if self.persister is not None:
            self.persister.persist()
            self.persister.emit_tier()
        if self.pool is not None:
            self.pool.persist()
            if self.pool.enforce_cap():
                self.stats.conversations_evicted = self.pool.evicted
                self._account_stores()

    def route_score(self, prompt: Sequence[int]) -> int:
        """What routing `prompt` to this lane gains: the tokens it reuses less the tokens
        of history it would drop (with conversations, none: a new one gets its own slot)."""
        if self.pool is not None:
            return self.pool.best_prefix(prompt)
        table = self.session.table
        shared = table.common_prefix(prompt)
        return shared - (table.n_tokens - shared)

    def window_tiers(self) -> dict[str, list[int]]:
        """The blocks each tier of the last window plan holds."""
        return self.session.window.resident_tiers()

    @property
    def last_turn(self) -> TurnStats:
        return self.session.last_turn

    @property
    def live_turn(self) -> TurnStats | None:
        """The statistics of the turn being generated (timings_per_token), when the session
        publishes them as `live_turn`; None otherwise."""
        return getattr(self.session, "live_turn", None)

    def _account(self, turn: TurnStats) -> None:
        self.stats.add_turn(turn)
        self._account_stores()
        if self.pool is not None:
            self.stats.conversations = sum(
                1 for c in self.pool.conversations if c.first_prompt_tokens
            )
            self.stats.conversation_switches = self.pool.cost.switches
            self.stats.conversation_switch_ms = self.pool.cost.ms
            self.stats.conversations_evicted = self.pool.evicted
        self.stats.gpu_cells_used = self.session.window.cells_used()
        self.stats.gpu_cells_peak = self.session.window.peak_cells
        stores = self._tier_stores()
        if stores:
            self.stats.set_tiers(stores)

    def tier_gauges(self) -> dict[str, int]:
        """The disk tier's `EngineStats.tier_*` figures now, from any thread; empty without
        `--kvmem-disk-dir`. The stats' copy is taken at each turn's end, before the writer
        thread has landed that turn's blocks."""
        stores = self._tier_stores()
        return tier_gauges(stores) if stores else {}

    def _tier_stores(self) -> list[TieredStore]:
        if self.conv_disk is not None:
            return list(self.conv_disk.stores.values())
        return [self.disk_store] if self.disk_store is not None else []

    def _account_stores(self) -> None:
        sessions = [c.session for c in self.pool.conversations] if self.pool else [self.session]
        self.stats.host_store_bytes = sum(s.store.nbytes for s in sessions)
        self.stats.host_blocks = sum(len(s.store) for s in sessions)

    def transfer_profile(self) -> dict[str, dict[str, float | int | None]]:
        """Time and bytes per data-movement path since the last reset (TransferPath), with
        the eval callback's calls under `capture` and the host buffers held under `staging`
        (KVTransfer.held_bytes)."""
        profile = self.session.transfer.profile
        capture = self._capture
        if capture is not None:
            profile.paths[TransferPath.CAPTURE] = PathTiming(
                capture.node_calls, capture.read_ms, capture.read_bytes
            )
        return {**profile.snapshot(), "staging": self.session.transfer.held_bytes()}

    def reset(self) -> None:
        self.session.transfer.profile.clear()
        if self._capture is not None:
            self._capture.reset_counters()
        self.session.reset()
        self._persist()

    def close(self) -> None:
        if self.disk_store is not None:
            self.disk_store.close()
        if self.pool is not None:
            self.pool.close()
        if isinstance(self.session.index, BackgroundIndex):
            self.session.index.close()
        self.session.transfer.close()  # the pinned staging buffer
        if self.session.spec is not None:
            self.session.spec.close()  # its pinned snapshot buffer
        if self.mtp is not None:
            self.mtp.close()
        if self.scoring is not None:
            self.scoring.close()
        self.ctx.close()
        if self.vision is not None:
            self.vision.close()
        if self._owns_model:
            self.model.close()


def _with_seed(params: SamplingParams, seed: int) -> SamplingParams:
    return replace(params, seed=seed)
