"""The GPU working set of one session: the one owner of where every block is.

Only this class writes residency (GPU, host store) and cell positions. Reselection is
split in two: `plan` (pure: scores the candidates, plans the tiers, lays the window out,
decides the replay) and `apply` (evicts, moves and restores exactly what the plan says).
The other residency changes are plans too (window_plans.py: a prefill chunk's stream
window, room for a decode, a cut of the history), each with an apply returning the
`Moves` the turn adds to its stats.
Prefill chunks see `stream_window`, a function of their position alone, so the KV of
every block depends on the request's tokens only, never on what the server saw before.
The residency writes themselves, and the invariant they keep, are in residency.py; a
block is moved (shifted away from its own positions) at most once between two restores.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence

from kvmem.memory.kv_cells import LayPlan, plan_lay
from kvmem.memory.layout import window_layout
from kvmem.memory.planner import (
    RetrievalMethod,
    Tier,
    WindowRequest,
    plan_window,
    ranked_candidates,
)
from kvmem.memory.scorer import QueryVectors
from kvmem.memory.spans import PromptSpans, TokenSpan

from ..llama.batch_rows import MAIN_SEQ
from ..query.block_scores import BlockScores
from ..trace import Moves, TraceKind
from .reselection import (
    UNSCORED,
    Applied,
    Reselection,
    replay_start,
    score_candidates,
    trace_reselect,
)
from .residency import WindowResidency
from .window_plans import (
    CutPlan,
    RoomChoice,
    StreamAt,
    StreamPlan,
    keep_from,
    next_lay_restore,
    next_stream_stage_in,
    plan_cut,
    plan_room_for,
    plan_stream,
    stream_keep,
)

logger = logging.getLogger(__name__)

__all__ = ["Applied", "BlockScores", "GpuWindow", "Reselection", "StreamAt", "TokenSpan"]


class GpuWindow(WindowResidency):
    """The window's plans and their applies, over its residency writes."""

    # prefill ---------------------------------------------------------------------------
    def plan_stream(self, at: StreamAt) -> StreamPlan:
        """What the GPU must change so a prefill chunk at `at.position` sees its stream
        window (window_plans.plan_stream; pure)."""
        return plan_stream(self.table, self.moved, self.config, at)

    def apply_stream(self, plan: StreamPlan) -> Moves:
        """Evict and restore as planned (traced as KVMEM_STREAM when anything moves)."""
        moves = self.evict(plan.evict)
        if plan.evict or plan.stage_in:
            self.tracer.emit(
                TraceKind.STREAM,
                at=plan.position,
                evict=list(plan.evict),
                stage_in=list(plan.stage_in),
            )
        moves += self.restore(self.own_starts(plan.stage_in))
        moves.evicted_blocks += len(plan.evict)
        return moves

    def prepare_next_stream(self, at: StreamAt) -> bool:
        """Between turns: build on the builder's thread the restore blobs the next turn's
        first prefill chunk stages in when it goes on from `at.position` (read only; used
        only by a restore of exactly those blocks, still stored as they were)."""
        stage_in = next_stream_stage_in(self.table, self.moved, self.config, at)
        return self.transfer.prepare(stage_in)

    def plan_lay(self, order: Sequence[int]) -> LayPlan:
        """How the context reaches the fresh cells whose blocks are `order`, in cell order
        from cell 0 (kv_cells.plan_lay over the cells it follows; pure)."""
        bt, gpu = self.table.block_tokens, self.table.gpu_blocks()
        return plan_lay(self.ctx.cells, order, gpu, self.moved, bt)

    def prepare_next_lay(self, resume: int, order: Sequence[int]) -> bool:
        """Between turns, in the canonical cell order: build the blobs of the restore that
        lays the next turn's cells when it goes on from `resume` on the fresh cells whose
        blocks are `order` (window_plans.next_lay_restore; read only)."""
        laid = next_lay_restore(self.table, self.moved, self.ctx.cells, resume, order)
        return self.transfer.prepare(laid, ordered=True)

    def note_groups(self, groups: Sequence[TokenSpan]) -> None:
        """The token ranges (images) that evictions outside the planner keep whole."""
        self._groups = tuple(groups)

    # room for decodes that are not prefill (replay, generation) ---------------------------
    def plan_room(self, n_tokens: int, gen_start: int | None = None) -> RoomChoice:
        """The blocks to evict so `n_tokens` more cells fit (pure; `gen_start`: this
        generation's start, whose blocks spill first)."""
        used = self.cells_used()
        return plan_room_for(
            self.table, used, self.capacity, n_tokens, gen_start, self.last_plan, self._groups
        )

    def apply_room(self, choice: RoomChoice) -> Moves:
        """Evict the chosen blocks (traced as KVMEM_SPILL or KVMEM_EVICT)."""
        if not choice.victims:
            return Moves()
        moves = self.evict(list(choice.victims))
        moves.spilled_blocks += len(choice.room.spilled)
        moves.evicted_blocks += len(choice.room.evicted)
        kind = TraceKind.SPILL if choice.spill else TraceKind.EVICT
        self.tracer.emit(kind, blocks=sorted(choice.victims), cells=self.cells_used())
        return moves

    def ensure_room(self, n_tokens: int, gen_start: int | None = None) -> Moves:
        """Plan the room for `n_tokens` more cells and apply it."""
        return self.apply_room(self.plan_room(n_tokens, gen_start))

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
        store, history = self.transfer.store, self.table.token_array()
        return score_candidates(self.index, store, self.config, history, ranked, query)

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
        method, scored = self._ranking(self.candidates(request), query, scored)
        # complete blocks only: the open block (kept partial by a truncation) stays put
        resident = [b for b in t.gpu_blocks() if b < t.n_complete_blocks]
        values = scored.values if scored is not None else None
        plan = plan_window(self.planner_config(method), request, resident, values)
        done = t.n_complete_blocks
        starts = window_layout(set(plan.selected), done, t.block_tokens, self.positions)
        replay = None
        if not pending:
            replay = replay_start(self.config, self._seen, plan, starts, spans, n_prompt, done)
        return Reselection(plan, starts, replay, scored or UNSCORED)

    def _ranking(
        self, ranked: tuple[int, ...], query: QueryVectors | None, scored: BlockScores | None
    ) -> tuple[RetrievalMethod, BlockScores | None]:
        """How a plan ranks its candidates: by their scores for `query` (those computed
        ahead when they are for these candidates), or by recency when nothing scores them."""
        if not ranked:
            return self.config.method, None
        if query is None or self.index is None:
            return RetrievalMethod.RECENCY, None
        if scored is None or scored.ranked != ranked:
            scored = self.score(ranked, query)
        return self.config.method, scored

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
            keep = stream_keep(self.config, stream)
            last = keep_from(stream.position, stream.grid, t.block_tokens)
            resident = [b for b in range(request.n_complete) if b >= last or b in keep]
        plan = plan_window(self.planner_config(), request, resident, scored.values)
        return self.transfer.prepare(plan.stage_in)

    def apply(self, res: Reselection) -> Applied:
        """Evict, move and restore exactly what the plan says; record the new residency."""
        t0 = time.perf_counter()
        plan, starts = res.plan, res.starts
        # a block already moved is restored afresh rather than shifted a second time
        restage = [b for b in plan.keep if b in self.moved and self.moved[b] != starts[b]]
        moves = Moves()
        if plan.evict or plan.stage_in or restage or self._shifts(plan.keep, starts):
            moves = self.harvest()  # a move shifts the cells a harvest reads at their places
        moves += self.evict(list(plan.evict) + restage)
        t_move = time.perf_counter()
        stay = [b for b in plan.keep if b not in restage]
        moved = self._move({b: self.start(b) for b in stay}, starts)
        t_restore = time.perf_counter()
        coming = set(plan.stage_in) | set(restage)
        restored = self.restore({b: starts[b] for b in sorted(coming)})
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
        trace_reselect(self.tracer, res, applied, ms, self.table.n_complete_blocks)
        return applied

    def _shifts(self, keep: Sequence[int], starts: Mapping[int, int]) -> bool:
        """Whether a kept block goes elsewhere (a plan that changes nothing harvests nothing
        now: its blocks go to the host at the next harvest or the turn's end)."""
        return any(starts[b] != self.start(b) for b in keep)

    def _move(self, resident: dict[int, int], starts: dict[int, int]) -> int:
        """Shift resident blocks (block id -> first position now) to `starts`."""
        moved = self.transfer.move(resident, starts)
        bt = self.table.block_tokens
        for b in resident:
            if starts[b] != b * bt:
                self.moved[b] = starts[b]
        return moved

    # truncation ------------------------------------------------------------------------
    def plan_cut(self, n_keep: int, *, keep_window: bool) -> CutPlan:
        """Forgetting the history from `n_keep` on (window_plans.plan_cut; pure)."""
        return plan_cut(self.table, self.moved, n_keep, keep_window=keep_window)

    def apply_cut(self, plan: CutPlan) -> Moves:
        """Cut the history as planned: the flush first (the cut drops host copies: none may
        still be on its way), the moved blocks' evictions, the partial block's restore."""
        moves = self.flush()
        moves += self.evict(plan.evict)
        if plan.restore is not None:
            moves += self.restore({plan.restore: plan.restore * self.table.block_tokens})
        n_keep = plan.n_keep
        self.ctx.seq_rm(MAIN_SEQ, n_keep, -1)
        result = self.table.truncate(n_keep)
        self.transfer.store.drop(result.dropped_blocks)
        if self.index is not None:
            self.index.remove(result.dropped_blocks)
        if not plan.keep_window:
            self.last_plan = None
        cut = n_keep // self.table.block_tokens
        self._seen = {b: p for b, p in self._seen.items() if b < cut}
        return moves

    def resident_tiers(self) -> dict[str, list[int]]:
        """The last plan's blocks per tier (for /props)."""
        plan = self.last_plan
        return {} if plan is None else {t.value: list(plan.tier(t)) for t in Tier}
