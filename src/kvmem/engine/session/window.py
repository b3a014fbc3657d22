"""The GPU working set of one session: the one owner of where every block is.

Only this class writes residency (GPU, host store) and cell positions. Reselection is
split in two: `plan` (pure: scores the candidates, plans the tiers, lays the window out,
decides the replay) and `apply` (evicts, moves and restores exactly what the plan says).
Prefill chunks see `stream_window`, a function of their position alone, so the KV of
every block depends on the request's tokens only, never on what the server saw before.

Invariant: every complete block is on the GPU or in the host store, and the open (partial)
tail block is on the GPU. Complete blocks wait on the GPU, at their own positions, until
`--kvmem-harvest-tokens` of them are waiting, then go to the host in one state read; they
are harvested before any of them is evicted or moved, and at every `flush` (a plan, the
end of a turn). A block is moved (shifted away from its own positions) at most once
between two restores.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from kvmem.config import KVMemConfig, QueryReplay
from kvmem.errors import KVTransferError
from kvmem.memory.block_table import BlockTable
from kvmem.memory.eviction import Residency, plan_room
from kvmem.memory.exact_scorer import (
    RERANK_FACTOR,
    RankMode,
    exact_block_scores,
    rerank_scores,
)
from kvmem.memory.layout import PositionMode, tail_run_start, window_layout
from kvmem.memory.planner import (
    PlannerConfig,
    RetrievalMethod,
    Tier,
    WindowPlan,
    WindowRequest,
    plan_window,
    ranked_candidates,
    stream_window,
)
from kvmem.memory.retrieval_index import RetrievalIndex
from kvmem.memory.scorer import QueryVectors, score_blocks
from kvmem.memory.spans import PromptSpans, TokenSpan

from ..llama.batch_rows import MAIN_SEQ
from ..llama.context import LlamaContext
from ..query.block_scores import BlockScores
from ..trace import Moves, TraceKind, Tracer
from ..transfer.kv_transfer import KVTransfer

logger = logging.getLogger(__name__)

__all__ = ["Applied", "BlockScores", "GpuWindow", "Reselection", "StreamAt", "TokenSpan"]


_UNSCORED = BlockScores((), {}, 0.0, 0.0, 0.0)  # a plan that ranked nothing by score


@dataclass(frozen=True, slots=True)
class Reselection:
    """A plan for one query: the tiers, where each block sits, and the replay."""

    plan: WindowPlan
    starts: dict[int, int]  # block id -> first position, for every selected block
    replay_from: int | None  # position to re-decode from, None = no replay
    scores: BlockScores = _UNSCORED  # what ranked the candidates, and its time


@dataclass(frozen=True, slots=True)
class StreamAt:
    """Where a prefill chunk starts and what its stream window is computed from."""

    position: int
    spans: PromptSpans
    room: int  # KV cells for the window besides the chunk
    grid: int  # the absolute chunk grid (a multiple of the block size)


def keep_from(position: int, grid: int, block_tokens: int) -> int:
    """The first block of the chunk (on `grid`) holding `position`: a chunk at `position`
    keeps every block from there on."""
    return (position - position % grid) // block_tokens


@dataclass(slots=True)
class Applied:
    """What applying a plan did."""

    stage_in: int = 0
    built_ahead: int = 0  # of the stage-ins, blocks whose blob was built beside the prefill
    bytes_in: int = 0
    evicted: int = 0
    moved: int = 0
    restore_ms: float = 0.0
    evict_ms: float = 0.0  # the evictions (restaged blocks too)
    move_ms: float = 0.0  # the shifts of resident blocks
    moves: Moves = field(default_factory=Moves)  # for the turn's stats


@dataclass(frozen=True, slots=True)
class Truncated:
    dropped: tuple[int, ...]  # the blocks whose host copies went
    moves: Moves  # the flush before the cut, the moved blocks' evictions, the partial block


class GpuWindow:
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
        c = self.config
        bounds = c.tier_tokens()
        return PlannerConfig(
            block_tokens=c.block_tokens,
            budget_tokens=c.budget,
            sink_blocks=c.sink_blocks,
            recent_blocks=c.recent_blocks,
            method=method or c.method,
            control_tokens=bounds["control"],
            query_tokens=bounds["query"],
            trajectory_tokens=bounds["trajectory"],
            stream_tokens=bounds["stream"],
        )

    # residency writes ------------------------------------------------------------------
    def append(self, tokens: Sequence[int]) -> Moves:
        """Tokens were decoded at the end of the history: record them; harvest the blocks
        waiting once they reach `--kvmem-harvest-tokens`."""
        done = self.table.append(tokens)
        self.table.mark_on_gpu(done)
        moves = Moves()
        if self.config.enabled and done:
            self.waiting += done
            if len(self.waiting) * self.table.block_tokens >= self.config.harvest_tokens:
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

    def restore(self, starts: dict[int, int]) -> Moves:
        """Copy host blocks in at `starts` (block id -> first position)."""
        if not starts:
            return Moves()
        res = self.transfer.restore(sorted(starts), starts)
        bt = self.table.block_tokens
        for b in res.block_ids:
            if starts[b] != b * bt:
                self.moved[b] = starts[b]
        self.table.mark_on_gpu(res.block_ids)
        return Moves(
            stage_in_blocks=res.blocks,
            stage_in_bytes=res.bytes,
            restore_ms=res.ms,
            built_ahead_blocks=res.built_ahead,
        )

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
        bt = self.table.block_tokens
        wanted = [b for b in block_ids if not self.table.is_on_gpu(b)]
        return self.restore({b: b * bt for b in wanted})

    # prefill ---------------------------------------------------------------------------
    def stream_to(self, position: int, spans: PromptSpans, room: int, grid: int) -> Moves:
        """Make the GPU hold the window a prefill chunk starting at `position` sees: the
        stream window of the start of its chunk on the absolute `grid` (a multiple of the
        block size), plus the tokens from there to `position`, all at their own positions.
        A prefill that starts mid-chunk (after a reused prefix) so sees what the whole
        chunk of a fresh prefill sees."""
        keep = self._stream_keep(position, spans, room, grid)
        keep.update(
            range(keep_from(position, grid, self.table.block_tokens), self.table.n_complete_blocks)
        )
        gpu = set(self.table.gpu_blocks())
        done = self.table.n_complete_blocks
        out = sorted(b for b in gpu if b < done and (b not in keep or b in self.moved))
        moves = self.evict(out)
        missing = sorted(b for b in keep if not self.table.is_on_gpu(b))
        if out or missing:
            self.tracer.emit(TraceKind.STREAM, at=position, evict=out, stage_in=missing)
        moves += self.restore_own(missing)
        moves.evicted_blocks += len(out)
        return moves

    def _stream_keep(self, position: int, spans: PromptSpans, room: int, grid: int) -> set[int]:
        """The blocks before its chunk that a prefill chunk at `position` sees."""
        if self.config.stream_cap:  # the fidelity decomposition's truncated stream
            room = min(room, self.config.stream_cap)
        chunk_start = position - position % grid
        return set(stream_window(self.planner_config(), chunk_start, spans, room))

    def note_groups(self, groups: Sequence[TokenSpan]) -> None:
        """The token ranges (images) that evictions outside the planner keep whole."""
        self._groups = tuple(groups)

    # room for decodes that are not prefill (replay, generation) ---------------------------
    def ensure_room(self, n_tokens: int, gen_start: int | None = None) -> Moves:
        """Evict host-backed blocks until `n_tokens` more cells fit in the capacity: this
        generation's oldest blocks first (the ring spill), then retrieved blocks."""
        need = self.cells_used() + n_tokens - self.capacity
        if need <= 0:
            return Moves()
        t = self.table
        residency = Residency(t.gpu_blocks(), t.n_tokens, t.n_complete_blocks, t.block_tokens)
        n_blocks = math.ceil(need / t.block_tokens)
        room = plan_room(residency, n_blocks, gen_start, self.last_plan, self._groups)
        if len(room.victims) < n_blocks:
            raise KVTransferError(
                f"cannot free {need} KV cells: the window holds no evictable block "
                f"(capacity {self.capacity}, used {self.cells_used()})"
            )
        moves = self.evict(list(room.victims))
        moves.spilled_blocks += len(room.spilled)
        moves.evicted_blocks += len(room.evicted)
        kind = TraceKind.SPILL if gen_start is not None else TraceKind.EVICT
        self.tracer.emit(kind, blocks=sorted(room.victims), cells=self.cells_used())
        return moves

    # reselection -----------------------------------------------------------------------
    def request(
        self, spans: PromptSpans, forced: Sequence[int] = (), pending: int = 0, n_tokens: int = -1
    ) -> WindowRequest:
        """What a plan is asked for, with the history at `n_tokens` (-1: as it is now) and
        `pending` prompt tokens after it."""
        bt = self.table.block_tokens
        n = self.table.n_tokens if n_tokens < 0 else n_tokens
        return WindowRequest(
            n_complete=n // bt,
            open_tokens=n - (n // bt) * bt + pending,
            spans=spans,
            forced=tuple(forced),
        )

    def candidates(self, request: WindowRequest) -> tuple[int, ...]:
        """The blocks a plan for `request` scores (empty: none is ranked)."""
        return ranked_candidates(self.planner_config(self.config.method), request)

    def score(self, ranked: Sequence[int], query: QueryVectors) -> BlockScores:
        """The candidates' scores for `query` (pure: reads the index and the store). Safe on
        another thread while the prefill goes on, in the default rank mode: it waits only
        for the candidates' summaries and reads nothing the prefill writes."""
        assert self.index is not None
        c = self.config
        t_index = time.perf_counter()
        self.index.score_table(ranked)  # summaries still being computed: waited for here
        ts = time.perf_counter()
        if c.rank is RankMode.EXACT:  # the oracle: exact mass over the stored keys
            values = exact_block_scores(self.transfer.store, self.index.geometry, ranked, query)
        else:
            values = score_blocks(
                self.index,
                ranked,
                query,
                workers=c.score_workers,
                mode=c.score_mode,
                aggregate=c.score_aggregate,
                max_logits=c.score_mlogits * 1_000_000,
            )
        if c.rank is RankMode.RERANK:  # the shortlist reordered by its exact mass
            shortlist = RERANK_FACTOR * (c.budget // self.table.block_tokens)
            store, geometry = self.transfer.store, self.index.geometry
            pinned = sorted(set(range(self.table.n_complete_blocks)) - set(ranked))
            values = rerank_scores(store, geometry, ranked, values, query, shortlist, pinned)
        t_end = time.perf_counter()
        return BlockScores(
            ranked=tuple(ranked),
            values={b: float(v) for b, v in zip(ranked, values, strict=True)},
            score_ms=(t_end - ts) * 1e3,
            index_ms=(ts - t_index) * 1e3,
            wait_ms=(t_end - t_index) * 1e3,
        )

    def plan(
        self,
        spans: PromptSpans,
        query: QueryVectors | None,
        n_prompt: int,
        forced: Sequence[int] = (),
        pending: int = 0,
        scored: BlockScores | None = None,
    ) -> Reselection:
        """The window for this query (pure: reads the index and the residency only).

        `pending`: prompt tokens after the history, decoded once the plan is applied (the
        deferred tail): they get room next to the window, and nothing is replayed.
        `scored`: the candidates' scores for `query`, computed ahead (`score`); used when
        they are this plan's candidates, else the plan scores them itself."""
        t = self.table
        request = self.request(spans, forced, pending)
        method = self.config.method
        ranked = self.candidates(request)
        if ranked and query is not None and self.index is not None:
            if scored is None or scored.ranked != ranked:
                scored = self.score(ranked, query)
        elif ranked:
            method, scored = RetrievalMethod.RECENCY, None
        else:
            scored = None
        # complete blocks only: the open block (kept partial by a truncation) stays put
        resident = [b for b in t.gpu_blocks() if b < t.n_complete_blocks]
        values = scored.values if scored is not None else None
        plan = plan_window(self.planner_config(method), request, resident, values)
        starts = window_layout(
            set(plan.selected), t.n_complete_blocks, t.block_tokens, self.positions
        )
        replay = None if pending else self._replay_start(plan, starts, spans, n_prompt)
        return Reselection(plan, starts, replay, scored or _UNSCORED)

    def prepare_restore(
        self, request: WindowRequest, scored: BlockScores, stream: StreamAt | None
    ) -> bool:
        """Build beside the prefill the restore blobs of what the plan for `request` will
        stage in, given the window the prefill's last chunk (`stream`; None: the window
        now) leaves (read only; the restore uses them only if it stages in exactly those
        blocks)."""
        t = self.table
        resident = [b for b in range(t.n_complete_blocks) if t.is_on_gpu(b)]
        if stream is not None:  # the last chunk's stream window, restored where it is not
            keep = self._stream_keep(stream.position, stream.spans, stream.room, stream.grid)
            last = keep_from(stream.position, stream.grid, t.block_tokens)
            resident = [b for b in range(request.n_complete) if b >= last or b in keep]
        plan = plan_window(self.planner_config(), request, resident, scored.values)
        return self.transfer.prepare(plan.stage_in)

    def _replay_start(
        self, plan: WindowPlan, starts: dict[int, int], spans: PromptSpans, n_prompt: int
    ) -> int | None:
        """Where to re-decode from so that the live tail sees the window chosen for it
        (`auto`: only when that window differs from the one the tail was computed against)."""
        mode = self.config.query_replay
        if mode is QueryReplay.OFF:
            return None
        if mode is QueryReplay.AUTO:
            seen_n = max(self._seen, default=-1) + 1
            chosen = {b: p for b, p in starts.items() if b < seen_n}
            if chosen == self._seen:
                return None
        bt = self.table.block_tokens
        run = tail_run_start(set(plan.selected), self.table.n_complete_blocks) * bt
        live = spans.live.start if spans.live is not None else 0
        start = max(live, n_prompt - self.config.query_pin_tokens, run, 1)
        return start if start < n_prompt else None

    def apply(self, res: Reselection) -> Applied:
        """Evict, move and restore exactly what the plan says; record the new residency."""
        t0 = time.perf_counter()
        plan, starts, bt = res.plan, res.starts, self.table.block_tokens
        # a block already moved is restored afresh rather than shifted a second time
        restage = [b for b in plan.keep if b in self.moved and self.moved[b] != starts[b]]
        moves = self.harvest()  # a move shifts the cells a harvest reads at their own positions
        moves += self.evict(list(plan.evict) + restage)
        resident = {b: self.start(b) for b in plan.keep if b not in restage}
        t_move = time.perf_counter()
        moved = self.transfer.move(resident, starts)
        for b in resident:
            if starts[b] != b * bt:
                self.moved[b] = starts[b]
        t_restore = time.perf_counter()
        restored = self.restore({b: starts[b] for b in sorted(set(plan.stage_in) | set(restage))})
        moves += restored
        moves.evicted_blocks += len(plan.evict)
        moves.score_ms += res.scores.score_ms + res.scores.index_ms
        self.last_plan = plan
        self.note_peak()
        ms = (time.perf_counter() - t0) * 1e3 + res.scores.wait_ms  # what the turn waited for
        moves.reselect_ms += ms
        applied = Applied(
            stage_in=restored.stage_in_blocks,
            built_ahead=restored.built_ahead_blocks,
            bytes_in=restored.stage_in_bytes,
            evicted=len(plan.evict),
            moved=moved,
            restore_ms=restored.restore_ms,
            evict_ms=(t_move - t0) * 1e3,
            move_ms=(t_restore - t_move) * 1e3,
            moves=moves,
        )
        self._trace(res, applied, ms)
        return applied

    def _trace(self, res: Reselection, applied: Applied, ms: float) -> None:
        plan, scores = res.plan, res.scores
        tiers = {f"{t.value}": plan.tier(t) for t in Tier}
        self.tracer.emit(
            TraceKind.RESELECT,
            candidates=self.table.n_complete_blocks,
            selected=len(plan.selected),
            keep=len(plan.keep),
            stage_in=applied.stage_in,
            built_ahead=applied.built_ahead,
            evict=applied.evicted,
            moved=applied.moved,
            bytes_in=applied.bytes_in,
            ms=ms,
            score_ms=scores.score_ms,
            index_wait_ms=scores.index_ms,
            ahead="-" if scores.ahead_at < 0 else scores.ahead_at,
            score_wait_ms=scores.wait_ms,
            evict_ms=applied.evict_ms,
            move_ms=applied.move_ms,
            restore_ms=applied.restore_ms,
            replay="-" if res.replay_from is None else res.replay_from,
            **tiers,
        )
        for tier, blocks in plan.unpinned.items():
            self.tracer.emit(TraceKind.TIER_DROP, tier=tier.value, blocks=blocks)

    # truncation ------------------------------------------------------------------------
    def truncate(self, n_keep: int, *, keep_window: bool) -> Truncated:
        """Forget history from `n_keep` on; returns the blocks whose host copies went.

        Unless `keep_window` (a replay of the tail run, which every moved block precedes),
        moved blocks leave the GPU first: their cells may sit at or after `n_keep`. A block
        left partial by the cut is on the GPU at its own positions afterwards."""
        bt = self.table.block_tokens
        moves = self.flush()  # the cut drops host copies: none may still be on its way
        if keep_window:
            if any(p + bt > n_keep or (b + 1) * bt > n_keep for b, p in self.moved.items()):
                raise KVTransferError(f"a moved block holds cells at or after {n_keep}")
        else:
            moves += self.evict(sorted(self.moved))
        cut = n_keep // bt
        if n_keep % bt and cut < self.table.n_complete_blocks and not self.table.is_on_gpu(cut):
            moves += self.restore({cut: cut * bt})
        self.ctx.seq_rm(MAIN_SEQ, n_keep, -1)
        result = self.table.truncate(n_keep)
        self.transfer.store.drop(result.dropped_blocks)
        if self.index is not None:
            self.index.remove(result.dropped_blocks)
        if not keep_window:
            self.last_plan = None
        self._seen = {b: p for b, p in self._seen.items() if b < cut}
        return Truncated(tuple(result.dropped_blocks), moves)

    def resident_tiers(self) -> dict[str, list[int]]:
        """The last plan's blocks per tier (for /props)."""
        plan = self.last_plan
        return {} if plan is None else {t.value: list(plan.tier(t)) for t in Tier}
