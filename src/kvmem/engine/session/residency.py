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

from kvmem.config import CellOrder, KVMemConfig
from kvmem.memory.block_table import BlockTable
from kvmem.memory.kv_cells import LayPlan
from kvmem.memory.layout import PositionMode
from kvmem.memory.planner import PlannerConfig, RetrievalMethod, WindowPlan
from kvmem.memory.retrieval_index import RetrievalIndex
from kvmem.memory.spans import TokenSpan

from ..llama.context import LlamaContext
from ..trace import Moves, TraceKind, Tracer
from ..transfer.kv_transfer import KVTransfer
from .window_plans import planner_config

logger = logging.getLogger(__name__)


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
        if self.keeps_order:
            ctx.track_cells()  # a turn then lays only the cells that differ (apply_lay)
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

    def restore(
        self, starts: Mapping[int, int], relaid: Collection[int] = (), *, ordered: bool = False
    ) -> Moves:
        """Copy host blocks in at `starts` (block id -> first position), their cells in id
        order (`ordered`: in the mapping's order); those of `relaid` were on the GPU before
        (laid again: counted apart from the stage-in)."""
        if not starts:
            return Moves()
        res = self.transfer.restore(list(starts), starts, ordered=ordered)
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
    # llama.cpp puts decoded and restored cells in the first free cells from its head, and
    # attention (flash attention's tiles and KV splits on the CPU included) sums over cells
    # in index order. A fresh prefill's chunks fill them by a rule that depends on the
    # request alone; a warm session's cells also depend on its history. So at a turn's
    # start, with `--kvmem-cell-order canonical`, the window is laid in the cells the
    # fresh prefill of the same prompt holds where this turn goes on (`apply_lay`):
    # from there on both run the same plans on the same cells.
    @property
    def keeps_order(self) -> bool:
        """Whether turns start on a fresh prefill's cells (`--kvmem-cell-order canonical`;
        not on hybrid memories, whose blobs carry a recurrent part, nor with an MTP draft
        context mirroring the main one)."""
        if self.config.cell_order is not CellOrder.CANONICAL or not self.config.enabled:
            return False
        return self.transfer.hybrid is None and self.ctx.observer is None

    def apply_lay(self, plan: LayPlan) -> Moves:
        """Lay the context's cells as planned (GpuWindow.plan_lay): the kept blocks stay,
        the evicted leave (or the context is emptied), and the rest of the fresh order
        goes in as one restore, its cells in that order."""
        bt = self.table.block_tokens
        moves = self.flush()
        held = set(self.table.gpu_blocks())  # laid again where restored; the others staged in
        if plan.clear:
            self.ctx.clear()
            self.table.mark_off_gpu(list(held))
            self.moved.clear()
        else:
            moves += self.evict(plan.evict)
            moves.evicted_blocks += len(set(plan.evict).difference(plan.restore))
        laid = {b: b * bt for b in plan.restore}
        moves += self.restore(laid, relaid=held.intersection(laid), ordered=True)
        self.tracer.emit(
            TraceKind.CELLS_LAID,
            kept=plan.kept,
            evicted=len(plan.evict),
            restored=len(plan.restore),
            cleared=int(plan.clear),
        )
        return moves

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
