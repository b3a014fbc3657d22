"""The parts one session runs its turns with, assembled by `engine/build.py`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvmem.config import KVMemConfig
from kvmem.memory.block_table import BlockTable
from kvmem.memory.host_store import BlockStore
from kvmem.memory.query_rows import QueryRows
from kvmem.memory.retrieval_index import RetrievalIndex

from ..hybrid.recurrent_hook import RecurrentHook
from ..llama.context import LlamaContext
from ..query.query_cache import QueryCache
from ..query.query_capture import QueryCapture
from ..query.query_source import QuerySource
from ..query.scoring_context import ScoringContext
from ..spec.spec_decode import SpecDecoder
from ..trace import Tracer
from ..transfer.kv_transfer import KVTransfer
from .ahead import AheadParts
from .decode import ChunkRunner
from .recompute import WindowRecompute
from .spec_target import SpecTarget
from .turn_plan import ChunkGrid
from .window import GpuWindow


@dataclass(slots=True)
class SessionParts:
    """One conversation's block table, store, window and the steps that use them."""

    ctx: LlamaContext
    config: KVMemConfig
    n_ctx: int
    tracer: Tracer
    is_eog: Callable[[int], bool]
    table: BlockTable
    store: BlockStore
    index: RetrievalIndex | None
    capture: QueryCapture | None  # on the main context (None with KVMem off)
    scoring: ScoringContext | None  # --kvmem-query-source scoring (None with KVMem off)
    transfer: KVTransfer
    window: GpuWindow
    grid: ChunkGrid
    queries: QueryCache  # the vectors of recent query spans
    rows: QueryRows  # the main context's query rows, by position
    source: QuerySource
    ssm: RecurrentHook  # ReplaySSM on a hybrid model, else the null hook
    spec: SpecDecoder | None  # speculative decoding
    spec_target: SpecTarget
    ahead: AheadParts
    runner: ChunkRunner
    recompute: WindowRecompute  # --kvmem-recompute: the retrieved blocks' KV after a reselection
