"""Engine: a model, its context and one KVMem session behind a small API.

This is what the chat layer, the server, the CLI and the benchmarks call.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

import llama_cpp
import numpy as np

from kvmem.config import KVCacheTypes, KVMemConfig
from kvmem.errors import ConfigError
from kvmem.memory.planner import RetrievalMethod
from kvmem.memory.retrieval_index import KeyGeometry, RetrievalIndex, default_score_layers
from kvmem.memory.rope import k_rotation_size

from .background_index import BackgroundIndex
from .context import ContextSettings, LlamaContext
from .llama_lib import ggml_base
from .model import LlamaModel, ModelInfo, resolve_model_path
from .query_capture import QueryCapture
from .sampler import SamplingParams
from .session import KVMemSession
from .trace import EngineStats, Tracer, TurnStats
from .window import TokenSpan

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EngineSettings:
    model_path: str | None = None  # None: the embedded default model
    n_ctx: int = 0  # logical context; 0 = the model's training context
    n_batch: int = 2048
    n_ubatch: int = 512
    n_threads: int | None = None
    n_threads_batch: int | None = None
    n_gpu_layers: int = -1
    flash_attn: bool = True
    offload_kqv: bool = True
    cache_types: KVCacheTypes = field(default_factory=KVCacheTypes)
    kvmem: KVMemConfig = field(default_factory=KVMemConfig)
    seed: int = -1

    def validate(self) -> None:
        if self.n_ctx < 0:
            raise ConfigError("-c", f"context size must be positive, got {self.n_ctx}")
        if self.n_batch <= 0:
            raise ConfigError("-b", f"batch size must be positive, got {self.n_batch}")
        if self.n_ubatch <= 0:
            raise ConfigError("-ub", f"ubatch size must be positive, got {self.n_ubatch}")
        self.cache_types.validate()
        self.kvmem.validate()
        if self.cache_types.v.is_quantized and not self.flash_attn:
            raise ConfigError("-ctv", "a quantized V cache needs flash attention (-fa on)")


class Engine:
    """Loads a model once and serves one KVMem session on it."""

    def __init__(self, settings: EngineSettings, trace_stream=None) -> None:
        settings.validate()
        path = resolve_model_path(settings.model_path)
        self.settings = settings
        self.model = LlamaModel(path, settings.n_gpu_layers)
        train_ctx = llama_cpp.llama_model_n_ctx_train(self.model.ptr)
        n_ctx = settings.n_ctx or train_ctx
        self.info: ModelInfo = self.model.describe(n_ctx)
        kv = settings.kvmem
        cells = min(kv.gpu_cells, n_ctx) if kv.enabled else n_ctx
        self.tracer = Tracer(kv.trace, trace_stream)
        self.key_geometry: KeyGeometry | None = None
        index, capture = self._retrieval_parts()
        ctx_settings = ContextSettings(
            n_cells=cells,
            n_batch=settings.n_batch,
            n_ubatch=settings.n_ubatch,
            n_threads=settings.n_threads,
            n_threads_batch=settings.n_threads_batch,
            flash_attn=settings.flash_attn,
            type_k=settings.cache_types.k,
            type_v=settings.cache_types.v,
            offload_kqv=settings.offload_kqv,
        )
        self.ctx = LlamaContext(self.model, ctx_settings, capture.callback if capture else None)
        self.session = KVMemSession(self.ctx, kv, n_ctx, index, capture, self.tracer, self.is_eog)
        self.stats = EngineStats(gpu_cells_max=self.session.capacity)
        self._eog: tuple[int, ...] | None = None
        logger.info(
            "engine ready: %s, n_ctx=%d, gpu cells=%d, kvmem=%s",
            self.info.name,
            n_ctx,
            self.session.capacity,
            kv.enabled,
        )

    def _retrieval_parts(self) -> tuple[RetrievalIndex | None, QueryCapture | None]:
        kv, info = self.settings.kvmem, self.info
        if not kv.enabled:
            return None, None
        if info.rope is None:
            logger.warning("rope type not supported for scoring: falling back to recency")
            return None, None
        layers = kv.score_layers or default_score_layers(info.n_layer)
        if any(layer >= info.n_layer for layer in layers):
            raise ConfigError("--kvmem-score-layers", f"the model has {info.n_layer} layers")
        k_type = self.settings.cache_types.k
        rotation = 0
        if k_type.is_quantized and os.environ.get("LLAMA_ATTN_ROT_DISABLE", "0") in ("", "0"):
            rotation = k_rotation_size(info.head_dim)
        geometry = KeyGeometry(
            n_layer=info.n_layer,
            n_head_kv=info.n_head_kv,
            head_dim=info.head_dim,
            k_type=k_type,
            rope=info.rope,
            k_rotation=rotation,
        )
        self.key_geometry = geometry
        capture = QueryCapture(ggml_base(), layers)  # recency captures too (for coverage)
        if kv.method is not RetrievalMethod.RETRIEVAL:
            return None, capture  # recency needs no block summaries
        workers = max(1, min(4, (os.cpu_count() or 2) // 4))
        return BackgroundIndex(geometry, layers, workers), capture

    # text ------------------------------------------------------------------------------
    def tokenize(
        self, text: str, *, add_special: bool = False, parse_special: bool = True
    ) -> list[int]:
        data = text.encode("utf-8")
        n_max = len(data) + 16
        buf = (llama_cpp.llama_token * n_max)()
        n = llama_cpp.llama_tokenize(
            self.model.vocab, data, len(data), buf, n_max, add_special, parse_special
        )
        if n < 0:
            buf = (llama_cpp.llama_token * -n)()
            n = llama_cpp.llama_tokenize(
                self.model.vocab, data, len(data), buf, -n, add_special, parse_special
            )
        return list(buf[:n])

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
        query: TokenSpan | None = None,
        sampling: SamplingParams | None = None,
        max_tokens: int = -1,
        grammar: str | None = None,
        cancel: threading.Event | None = None,
        logits_out: list[np.ndarray] | None = None,
        ignore_eos: bool = False,
        banned_tokens: Sequence[int] = (),
    ) -> Iterator[int]:
        sampling = sampling or SamplingParams()
        banned = tuple(banned_tokens) + (self.eog_tokens() if ignore_eos else ())
        if sampling.seed < 0 and self.settings.seed >= 0:
            sampling = _with_seed(sampling, self.settings.seed)
        try:
            yield from self.session.generate(
                prompt,
                query=query,
                sampling=sampling,
                max_tokens=max_tokens,
                grammar=grammar,
                cancel=cancel,
                logits_out=logits_out,
                banned_tokens=banned,
            )
        finally:
            self._account(self.session.last_turn)

    def teacher_force(
        self, prompt: Sequence[int], continuation: Sequence[int], *, query: TokenSpan | None = None
    ) -> np.ndarray:
        try:
            return self.session.teacher_force(prompt, continuation, query=query)
        finally:
            self._account(self.session.last_turn)

    @property
    def last_turn(self) -> TurnStats:
        return self.session.last_turn

    def _account(self, turn: TurnStats) -> None:
        self.stats.add_turn(turn)
        self.stats.host_store_bytes = self.session.store.nbytes
        self.stats.host_blocks = len(self.session.store)
        self.stats.gpu_cells_used = self.session.window.cells_used()
        self.stats.gpu_cells_peak = self.session.window.peak_cells

    def reset(self) -> None:
        self.session.reset()

    def close(self) -> None:
        if isinstance(self.session.index, BackgroundIndex):
            self.session.index.close()
        self.ctx.close()
        self.model.close()


def _with_seed(params: SamplingParams, seed: int) -> SamplingParams:
    return replace(params, seed=seed)
