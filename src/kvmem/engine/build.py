"""The composition root: the contexts of a loaded model and the sessions on them.

`Engine` loads the model and the stores; what runs a turn is assembled here, from its
parts: the main context (with the query capture's callback unless a scoring context
reads the query), the scoring context, the vision projector, the MTP draft context, and
per conversation a `KVMemSession` over its `SessionParts` (block table, store, window,
query source, recurrent hook, decode steps).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvmem.config import KVMemConfig, QuerySource
from kvmem.engine_settings import EngineSettings
from kvmem.memory.block_table import BlockTable
from kvmem.memory.host_store import BlockStore, HostStore
from kvmem.memory.query_rows import QueryRows
from kvmem.memory.retrieval_index import RetrievalIndex
from kvmem.spec_config import SpecConfig

from .hybrid.recurrent_hook import NullRecurrent, RecurrentHook
from .hybrid.replay_ssm import ReplaySSM
from .llama.context import ContextSettings, LlamaContext
from .llama.model import LlamaModel
from .media.media import VisionProjector
from .query.query_cache import QueryCache
from .query.query_capture import QueryCapture
from .query.query_source import query_source
from .query.scoring_context import ScoringContext
from .session.ahead import AheadParts
from .session.decode import ChunkRunner
from .session.parts import SessionParts
from .session.recompute import window_recompute
from .session.session import KVMemSession
from .session.spec_target import SpecTarget
from .session.turn_plan import ChunkGrid
from .session.window import GpuWindow
from .spec.mtp_draft import MtpDrafter
from .spec.spec_decode import spec_decoder
from .trace import Tracer
from .transfer.host_pages import use_ordinary_pages
from .transfer.kv_transfer import KVTransfer


@dataclass(slots=True)
class Contexts:
    """The llama.cpp contexts of one engine, and what reads them."""

    ctx: LlamaContext  # the main context: every session's KV lives here
    main_capture: QueryCapture | None  # the capture on the main context's callback
    scoring: ScoringContext | None  # --kvmem-query-source scoring: a context of its own
    vision: VisionProjector | None
    mtp: MtpDrafter | None  # --spec-type draft-mtp: the draft context


@dataclass(slots=True)
class EngineParts:
    """What every session of one engine shares."""

    contexts: Contexts
    config: KVMemConfig
    n_ctx: int
    tracer: Tracer
    is_eog: Callable[[int], bool]
    staging_bytes: int
    spec: SpecConfig


def context_settings(settings: EngineSettings, cells: int) -> ContextSettings:
    return ContextSettings(
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


def build_contexts(
    model: LlamaModel, settings: EngineSettings, cells: int, capture: QueryCapture | None
) -> Contexts:
    """The main context of `cells` cells and the contexts beside it."""
    kv = settings.kvmem
    if kv.enabled:
        use_ordinary_pages()  # the host store grows by fresh buffers: see host_pages.py
    ctx_settings = context_settings(settings, cells)
    # the main context's callback: the capture's, unless a scoring context reads the query
    scored_apart = capture is not None and kv.query_source is QuerySource.SCORING
    main_capture = None if scored_apart else capture
    ctx = LlamaContext(
        model,
        ctx_settings,
        main_capture.callback if main_capture else None,
        main_capture.user_data if main_capture else None,
    )
    if settings.warmup:  # before any session restores or uses the context
        ctx.warm_up()
        if main_capture is not None:
            main_capture.reset_counters()  # as llama-server resets its perf counters
    scoring = None
    if scored_apart:
        assert capture is not None
        sink = kv.sink_blocks * kv.block_tokens
        scoring = ScoringContext(model, ctx_settings, capture, sink, kv.query_max_tokens)
    vision = None
    if settings.vision is not None:
        vision = VisionProjector(model, settings.vision)
        ctx.vision = vision  # decodes the image rows of a prompt
        if scoring is not None:  # a query span may hold image rows too
            scoring.ctx.vision = vision
    mtp = None
    if settings.spec.wants_mtp:
        mtp = MtpDrafter(ctx, settings.spec.kv_type, settings.spec.n_max, settings.n_threads)
    return Contexts(ctx, main_capture, scoring, vision, mtp)


def build_session(
    parts: EngineParts, index: RetrievalIndex | None, store: BlockStore | None
) -> KVMemSession:
    """One conversation's session: its own block table, window, store and index."""
    return KVMemSession(session_parts(parts, index, HostStore() if store is None else store))


def session_parts(
    parts: EngineParts, index: RetrievalIndex | None, store: BlockStore
) -> SessionParts:
    """The parts of one session over the engine's contexts (capture and scoring only with
    KVMem on; a window of `--kvmem-gpu-tokens` cells, or the whole context without)."""
    c, config = parts.contexts, parts.config
    ctx, on = c.ctx, config.enabled
    table = BlockTable(config.block_tokens)
    capacity = min(config.gpu_cells, ctx.n_cells) if on else ctx.n_cells
    transfer = KVTransfer(ctx, table, store, index, parts.staging_bytes)
    window = GpuWindow(ctx, table, transfer, index, config, capacity, parts.tracer)
    grid = ChunkGrid.of(config, ctx.n_batch, capacity, parts.n_ctx, ctx.n_ubatch)
    queries, rows = QueryCache(), QueryRows()
    capture, scoring = (c.main_capture, c.scoring) if on else (None, None)
    source = query_source(c.main_capture, c.scoring, rows, queries, config, transfer.profile)
    ssm: RecurrentHook = ReplaySSM(ctx) if ctx.model.is_hybrid else NullRecurrent()
    return SessionParts(
        ctx=ctx,
        config=config,
        n_ctx=parts.n_ctx,
        tracer=parts.tracer,
        is_eog=parts.is_eog,
        table=table,
        store=store,
        index=index,
        capture=capture,
        scoring=scoring,
        transfer=transfer,
        window=window,
        grid=grid,
        queries=queries,
        rows=rows,
        source=source,
        ssm=ssm,
        spec=spec_decoder(parts.spec, c.mtp),
        spec_target=SpecTarget(ctx, parts.n_ctx, table, window, on),
        ahead=AheadParts(scoring, config, queries, window, table, index, grid, ssm.active),
        runner=ChunkRunner(ctx, table, window, capture, ssm, on, grid, transfer.profile),
        recompute=window_recompute(config, ctx, table, parts.tracer),
    )
