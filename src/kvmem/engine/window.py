"""The GPU working set of one session: room for new tokens, reselection, replay, truncation.

Invariant: every complete block is either on the GPU or in the host store (blocks are
harvested as soon as they complete), and the open (partial) tail block is on the GPU.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

from kvmem.config import KVMemConfig, QueryReplay
from kvmem.errors import KVTransferError
from kvmem.memory.block_table import BlockTable
from kvmem.memory.layout import PositionMode, window_layout
from kvmem.memory.planner import (
    PlannerConfig,
    RetrievalMethod,
    WindowPlan,
    plan_eviction,
    plan_window,
    scored_candidates,
)
from kvmem.memory.retrieval_index import RetrievalIndex
from kvmem.memory.scorer import QueryVectors, score_blocks

from .context import MAIN_SEQ, LlamaContext
from .kv_transfer import KVTransfer
from .trace import Tracer, TurnStats

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TokenSpan:
    """A half-open token range [start, end) of a prompt."""

    start: int
    end: int

    def __post_init__(self) -> None:
        if not 0 <= self.start <= self.end:
            raise ValueError(f"invalid token span [{self.start}, {self.end})")

    @property
    def length(self) -> int:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class Reselection:
    plan: WindowPlan | None
    replay_from: int | None  # position to re-decode from, None = no replay


class GpuWindow:
    """Keeps the context's cells within capacity and applies window plans."""

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
        self.positions = config.positions
        if self.positions is not PositionMode.ORIGINAL and not ctx.can_shift:
            logger.warning("this model's cache cannot shift positions: blocks stay in place")
            self.positions = PositionMode.ORIGINAL

    # accounting ------------------------------------------------------------------------
    def cells_used(self) -> int:
        t = self.table
        open_tokens = t.n_tokens - t.n_complete_blocks * t.block_tokens
        return len(t.gpu_blocks()) * t.block_tokens + open_tokens

    def note_peak(self) -> None:
        self.peak_cells = max(self.peak_cells, self.cells_used())

    def planner_config(self, method: RetrievalMethod | None = None) -> PlannerConfig:
        c = self.config
        return PlannerConfig(
            block_tokens=c.block_tokens,
            budget_tokens=c.budget,
            sink_blocks=c.sink_blocks,
            recent_blocks=c.recent_blocks,
            method=method or c.method,
        )

    # room ------------------------------------------------------------------------------
    def ensure_room(self, n_tokens: int, stats: TurnStats, gen_start: int | None = None) -> None:
        """Evict host-backed blocks until `n_tokens` more cells fit in the capacity."""
        need = self.cells_used() + n_tokens - self.capacity
        if need <= 0:
            return
        bt = self.table.block_tokens
        n_blocks = math.ceil(need / bt)
        victims: list[int] = []
        if gen_start is not None:
            victims = self._generation_spill(gen_start, n_blocks)
            stats.spilled_blocks += len(victims)
        if len(victims) < n_blocks:
            preferred = self.last_plan.selected if self.last_plan else ()
            rest = plan_eviction(
                self.planner_config(),
                [b for b in self.table.gpu_blocks() if b not in victims],
                self.table.complete_blocks(),
                preferred,
                n_blocks - len(victims),
            )
            victims.extend(rest)
            stats.evicted_blocks += len(rest)
        if len(victims) < n_blocks:
            raise KVTransferError(
                f"cannot free {need} KV cells: the window holds no evictable block "
                f"(capacity {self.capacity}, used {self.cells_used()})"
            )
        self.transfer.evict(victims)
        kind = "SPILL" if gen_start is not None else "EVICT"
        self.tracer.emit(kind, blocks=sorted(victims), cells=self.cells_used())

    def _generation_spill(self, gen_start: int, n_blocks: int) -> list[int]:
        """The oldest complete blocks of this generation, never the block before the next token."""
        bt = self.table.block_tokens
        newest = (self.table.n_tokens - 1) // bt
        ids = [b for b in self.table.gpu_blocks() if (b + 1) * bt > gen_start and b < newest]
        return ids[:n_blocks]

    # reselection -----------------------------------------------------------------------
    def reselect(
        self, query: QueryVectors | None, query_start: int | None, stats: TurnStats
    ) -> Reselection:
        """Choose the window for the current query and move only the blocks that change."""
        t0 = time.perf_counter()
        c, t = self.config, self.table
        bt = t.block_tokens
        pin_block = self._pin_block(query_start)
        candidates = list(range(pin_block))
        tail_tokens = t.n_tokens - pin_block * bt
        on_gpu = [b for b in t.gpu_blocks() if b < pin_block]
        scores = None
        method = c.method
        # only the blocks the plan ranks are scored: the sink and recent blocks are kept by
        # position, and leaving them out keeps them from absorbing the softmax
        ranked = scored_candidates(self.planner_config(method), candidates, tail_tokens)
        if ranked:
            if query is not None and self.index is not None:
                ts = time.perf_counter()
                values = score_blocks(self.index, ranked, query, mode=c.score_mode)
                scores = {b: float(s) for b, s in zip(ranked, values, strict=True)}
                stats.score_ms += (time.perf_counter() - ts) * 1e3
            else:
                method = RetrievalMethod.RECENCY
        plan = plan_window(self.planner_config(method), candidates, on_gpu, scores, tail_tokens)
        pinned = range(pin_block, t.n_complete_blocks)
        pinned_missing = [b for b in pinned if not t.is_on_gpu(b)]
        if plan.stage_out:
            self.transfer.evict(plan.stage_out)
        starts = window_layout(
            set(plan.selected).union(pinned), t.n_complete_blocks, c.sink_blocks, bt, self.positions
        )
        # complete blocks only: the open block (kept partial by a truncation) stays put
        resident = [b for b in t.gpu_blocks() if b < t.n_complete_blocks]
        moved = self.transfer.move({b: starts[b] for b in resident})
        restored = self.transfer.restore(list(plan.stage_in) + pinned_missing, starts)
        stats.stage_in_blocks += restored.blocks
        stats.stage_in_bytes += restored.bytes
        stats.restore_ms += restored.ms
        stats.evicted_blocks += len(plan.stage_out)
        self.last_plan = plan
        replay_from = self._replay_start(query_start, pin_block, bool(plan.stage_in))
        stats.reselect_ms += (time.perf_counter() - t0) * 1e3
        self.note_peak()
        self.tracer.emit(
            "RESELECT",
            candidates=len(candidates),
            selected=len(plan.selected),
            keep=len(plan.keep),
            stage_in=len(plan.stage_in),
            stage_out=len(plan.stage_out),
            retrieved=plan.retrieved,
            moved=moved,
            bytes_in=restored.bytes,
            ms=(time.perf_counter() - t0) * 1e3,
            replay="-" if replay_from is None else replay_from,
        )
        return Reselection(plan, replay_from)

    def _pin_block(self, query_start: int | None) -> int:
        """First block kept unconditionally: the query's (bounded so sink + recent still fit)."""
        c, t = self.config, self.table
        bt = t.block_tokens
        max_tail = c.budget - (c.sink_blocks + c.recent_blocks) * bt
        earliest = math.ceil(max(0, t.n_tokens - max_tail) / bt)
        start = t.n_tokens if query_start is None else query_start
        return min(max(start // bt, earliest), t.n_complete_blocks)

    def _replay_start(self, query_start: int | None, pin_block: int, staged_in: bool) -> int | None:
        """Where to re-decode from: the query sees the window chosen for it (`auto`: only
        when blocks came in; blocks that only moved hold the same text)."""
        mode = self.config.query_replay
        if query_start is None or mode is QueryReplay.OFF:
            return None
        if mode is QueryReplay.AUTO and not staged_in:
            return None
        return max(query_start, pin_block * self.table.block_tokens)

    def drop_from(self, position: int) -> None:
        """Remove every cell at `position` and later, and every block of those tokens."""
        self._release_moved(position, None, dropped_from=position)
        self.ctx.seq_rm(MAIN_SEQ, position, -1)

    def _release_moved(self, lo: int, hi: int | None, dropped_from: int | None = None) -> None:
        """Evict the moved blocks whose cells overlap positions [lo, hi) (None: no end)
        and those holding tokens at `dropped_from` or later."""
        bt = self.table.block_tokens
        victims = [
            b
            for b, p in self.transfer.moved.items()
            if (p + bt > lo and (hi is None or p < hi))
            or (dropped_from is not None and (b + 1) * bt > dropped_from)
        ]
        if victims:
            self.transfer.evict(victims)

    def ensure_block_on_gpu(self, block_id: int, stats: TurnStats) -> None:
        if (
            block_id < 0
            or self.table.is_on_gpu(block_id)
            or block_id >= self.table.n_complete_blocks
        ):
            return
        self.ensure_room(self.table.block_tokens, stats)
        bt = self.table.block_tokens
        self._release_moved(block_id * bt, (block_id + 1) * bt)  # its own positions
        res = self.transfer.restore([block_id])
        stats.stage_in_blocks += res.blocks
        stats.stage_in_bytes += res.bytes
