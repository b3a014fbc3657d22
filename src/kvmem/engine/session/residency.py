"""The residency writes of one session's GPU window: the blocks on the GPU, their cell
positions, the blocks waiting to be harvested, and the copies between GPU and host store.

`GpuWindow` (window.py) adds the plans; it is the only class that calls these writes
during a turn. Invariant: every complete block is on the GPU or in the host store, and
the open (partial) tail block is on the GPU. Complete blocks wait on the GPU, at their
own positions, until `--kvmem-harvest-tokens` of them are waiting, then go to the host
in one state read; they are harvested before any of them is evicted or moved, and at
every `flush` (a plan, the end of a turn).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from kvmem.config import CellOrder, KVMemConfig
from kvmem.memory.block_table import BlockTable
from kvmem.memory.layout import PositionMode
from kvmem.memory.planner import PlannerConfig, RetrievalMethod, WindowPlan
from kvmem.memory.retrieval_index import RetrievalIndex
from kvmem.memory.spans import TokenSpan

from ..llama.batch_rows import HARVEST_SEQ, MAIN_SEQ, RESTORE_SEQ
from ..llama.context import LlamaContext
from ..trace import Moves, Tracer
from ..transfer.kv_transfer import KVTransfer
from .window_plans import planner_config

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class Lifted:
    """GPU cells taken off the context so that the restore after them lays them again in
    position order: complete blocks (block id -> first position) and the open block's
    cells (its state blob), with what their eviction did."""

    starts: dict[int, int] = field(default_factory=dict)
    open_cells: np.ndarray | None = None  # uint8 [blob bytes]
    moves: Moves = field(default_factory=Moves)


def first_change(*blocks: Collection[int]) -> int | None:
    """The lowest block id a residency change touches (None: it touches none)."""
    return min((b for group in blocks for b in group), default=None)


class WindowResidency:
    """Where every block of one session is, and the moves that change it."""

    def __init__(
        self,
        ctx: LlamaContext,
        table: BlockTable,
        transfer: KVTransfer,
        index: RetrievalIndex | None,
        config: KVMemConfig,
        capacity: int,
        tracer: Tracer,
    ) -> None:
        self.ctx = ctx
        self.table = table
        self.transfer = transfer
        self.index = index
        self.config = config
        self.capacity = capacity
        self.tracer = tracer
        self.last_plan: WindowPlan | None = None
        self.peak_cells = 0
        self.moved: dict[int, int] = {}  # GPU block -> first position, when not its own
        self._seen: dict[int, int] = {}  # complete block -> start, as the last decode saw them
        self._groups: tuple[TokenSpan, ...] = ()  # the prompt's image groups (spans.groups)
        self.waiting: list[int] = []  # complete GPU blocks not yet harvested, ascending
        self.positions = config.positions
        if self.positions is not PositionMode.ORIGINAL and not ctx.can_shift:
            logger.warning("this model's cache cannot shift positions: blocks stay in place")
            self.positions = PositionMode.ORIGINAL

    # accounting ------------------------------------------------------------------------
    def start(self, block_id: int) -> int:
        """First context position of a GPU block's cells."""
        return self.moved.get(block_id, block_id * self.table.block_tokens)

    def cells_used(self) -> int:
        t = self.table
        open_tokens = t.n_tokens - t.n_complete_blocks * t.block_tokens
        return len(t.gpu_blocks()) * t.block_tokens + open_tokens

    def note_peak(self) -> None:
        self.peak_cells = max(self.peak_cells, self.cells_used())

    def note_decode(self) -> None:
        """Remember the window the next decoded tokens see (for the replay decision)."""
        done = self.table.n_complete_blocks
        self._seen = {b: self.start(b) for b in self.table.gpu_blocks() if b < done}

    def planner_config(self, method: RetrievalMethod | None = None) -> PlannerConfig:
        return planner_config(self.config, method)

    # residency writes ------------------------------------------------------------------
    def append(self, tokens: Sequence[int], *, harvest: bool = True) -> Moves:
        """Tokens were decoded at the end of the history: record them; harvest the blocks
        waiting once they reach `--kvmem-harvest-tokens` (`harvest=False`: not yet, a piece
        of a chunk whose last piece decides, as if the chunk were recorded whole)."""
        done = self.table.append(tokens)
        self.table.mark_on_gpu(done)
        moves = Moves()
        if self.config.enabled and done:
            self.waiting += done
        enough = len(self.waiting) * self.table.block_tokens >= self.config.harvest_tokens
        if harvest and self.waiting and enough:
            moves = self.harvest()
        self.note_peak()
        return moves

    def harvest(self) -> Moves:
        """Copy the complete blocks waiting on the GPU to the host store, in one state read
        (their copy-out may still run: `flush` waits for it)."""
        if not self.waiting:
            return Moves()
        res = self.transfer.harvest(self.waiting)
        self.waiting = []
        self.table.mark_in_host(res.block_ids)
        return Moves(harvested_blocks=res.blocks, harvested_bytes=res.bytes, harvest_ms=res.ms)

    def flush(self) -> Moves:
        """Every complete block in the host store and the index: those waiting harvested,
        the copy-outs landed."""
        moves = self.harvest()
        self.transfer.flush()
        return moves

    def evict(self, block_ids: Sequence[int]) -> Moves:
        """Remove blocks from the GPU (harvesting first, when one of them still waits);
        the evictions themselves are counted by the caller's plan."""
        if not block_ids:
            return Moves()
        moves = Moves()
        if self.waiting and not set(block_ids).isdisjoint(self.waiting):
            moves = self.harvest()
        self.transfer.evict({b: self.start(b) for b in block_ids})
        for b in block_ids:
            self.moved.pop(b, None)
        self.table.mark_off_gpu(block_ids)
        return moves

    def restore(self, starts: Mapping[int, int], relaid: Collection[int] = ()) -> Moves:
        """Copy host blocks in at `starts` (block id -> first position); those of `relaid`
        were on the GPU before (lifted: counted apart from the stage-in)."""
        if not starts:
            return Moves()
        res = self.transfer.restore(sorted(starts), starts)
        bt = self.table.block_tokens
        for b in res.block_ids:
            if starts[b] != b * bt:
                self.moved[b] = starts[b]
        self.table.mark_on_gpu(res.block_ids)
        n_relaid = len(relaid)
        relaid_bytes = res.bytes // res.blocks * n_relaid if res.blocks else 0
        return Moves(
            stage_in_blocks=res.blocks - n_relaid,
            stage_in_bytes=res.bytes - relaid_bytes,
            relaid_blocks=n_relaid,
            relaid_bytes=relaid_bytes,
            restore_ms=res.ms,
            built_ahead_blocks=res.built_ahead,
        )

    # cell order ------------------------------------------------------------------------
    # llama.cpp puts restored cells in the first free cells, and attention (flash attention's
    # tiles and KV splits on the CPU included) sums over cells in index order. So every
    # residency change keeps the canonical layout: the GPU blocks in position order from
    # cell 0, then the open block, nothing free in between (decodes append after them).
    # A change lifts the GPU blocks from the first block it touches on and lays them again,
    # after the blocks before it, together with the blocks it brings in: the cells, and so
    # every sum, are a function of the window, never of the history that built it.
    @property
    def keeps_order(self) -> bool:
        """Whether changes re-lay the cells after them (`--kvmem-cell-order canonical`; not
        on hybrid memories, whose blobs carry a recurrent part, nor with an MTP draft
        context mirroring the main one)."""
        if self.config.cell_order is not CellOrder.CANONICAL or not self.config.enabled:
            return False
        return self.transfer.hybrid is None and self.ctx.observer is None

    def lift_from(self, first: int | None) -> Lifted:
        """Take the GPU blocks from block `first` on, and the open block's cells, off the
        context (None: nothing changes, nothing is lifted)."""
        if first is None or not self.keeps_order:
            return Lifted()
        t = self.table
        done = t.n_complete_blocks
        tail = [b for b in t.gpu_blocks() if first <= b < done]
        starts = {b: self.start(b) for b in tail}
        moves = self.evict(tail)
        return Lifted(starts, self._lift_open(), moves)

    def _lift_open(self) -> np.ndarray | None:
        """The open block's cells as a state blob (own memory), removed from the context."""
        t = self.table
        p0, p1 = t.n_complete_blocks * t.block_tokens, t.n_tokens
        if p1 <= p0 or self.ctx.seq_pos_max(MAIN_SEQ) < p0:  # no open block on the GPU
            return None
        self.ctx.seq_cp(MAIN_SEQ, HARVEST_SEQ, p0, p1)
        try:
            cells = np.array(self.ctx.get_state(HARVEST_SEQ), dtype=np.uint8)  # [bytes]
        finally:
            self.ctx.seq_rm(HARVEST_SEQ, -1, -1)
        self.ctx.seq_rm(MAIN_SEQ, p0, p1)
        return cells

    def land(self, lifted: Lifted, restore: Mapping[int, int]) -> Moves:
        """Restore the blocks of `restore` (block id -> first position; the lifted ones
        among them) in one position-ordered pass, then the lifted open block's cells."""
        moves = lifted.moves
        moves += self.restore(restore, relaid=lifted.starts.keys())
        cells = lifted.open_cells
        if cells is not None:
            self.ctx.set_state(cells, RESTORE_SEQ)
            self.ctx.seq_cp(RESTORE_SEQ, MAIN_SEQ, -1, -1)
            self.ctx.seq_rm(RESTORE_SEQ, -1, -1)
            moves.relaid_bytes += len(cells)
        return moves

    def relay_from(self, first: int | None, restore: Mapping[int, int]) -> Moves:
        """Restore `restore` after lifting what follows block `first` (the lowest block the
        change touched), the lifted blocks where they were."""
        lifted = self.lift_from(first)
        return self.land(lifted, {**restore, **lifted.starts})

    def reset(self) -> None:
        """The context was cleared: no block is on the GPU any more."""
        self.table.mark_off_gpu(self.table.gpu_blocks())
        self.moved.clear()
        self._seen.clear()
        self.waiting = []  # their cells went with the context
        self.last_plan = None

    def adopt(self, tokens: Sequence[int], host_blocks: Sequence[int]) -> None:
        """History loaded from a store: its complete blocks are in the host store only."""
        self.table.append(tokens)
        self.table.mark_in_host(host_blocks)

    def restore_own(self, block_ids: Sequence[int]) -> Moves:
        """Copy host blocks in at their own positions (those not on the GPU already)."""
        return self.restore(self.own_starts(block_ids))

    def own_starts(self, block_ids: Sequence[int]) -> dict[int, int]:
        """Block id -> its own first position, for those of `block_ids` not on the GPU."""
        bt = self.table.block_tokens
        return {b: b * bt for b in block_ids if not self.table.is_on_gpu(b)}
