"""KVMemSession: one conversation on a llama.cpp context with a bounded KV window.

A turn: reuse the longest common prefix with the history (never past the frontier, the
first token whose KV saw a window a fresh server would not have built), prefill the new
suffix in block-aligned chunks that each see the stream window of their position
(capturing the query vectors), plan the window for the query by tiers and apply it,
replay the live tail if its window changed, then generate with the reserve (spilling
this generation's oldest complete block when the reserve is full). The KV of every
block, and so every greedy answer, is a function of the request's tokens alone.
With KVMem disabled the same loop runs on a full-size context with nothing moved.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from kvmem.config import RestoreAheadMode
from kvmem.errors import ContextLengthExceededError, InvalidRequestError, TurnCancelledError
from kvmem.memory.scorer import QueryVectors
from kvmem.memory.spans import PromptSpans, TokenSpan
from kvmem.sampling import SamplingParams

from ..llama.sampler import Sampler
from ..query.block_scores import BlockScores
from ..query.query_cache import SpanRows
from ..trace import FinishReason, PrefillProgress, TraceKind, TurnStats
from ..transfer.transfer_profile import TransferPath
from .ahead import begin_ahead
from .cell_order import turn_cells
from .decode import decode_tokens
from .generation import Generation
from .parts import SessionParts
from .prefill import prefill_chunks
from .turn_plan import TurnInputs, TurnPlan, plan_turn
from .turn_trace import trace_gen, trace_prefill, trace_query

logger = logging.getLogger(__name__)


class KVMemSession:
    """One conversation's turns over its parts (built by engine/build.py)."""

    def __init__(self, parts: SessionParts) -> None:
        self.parts = parts
        self.ctx, self.config, self.n_ctx = parts.ctx, parts.config, parts.n_ctx
        self.table, self.store, self.index = parts.table, parts.store, parts.index
        self.capture, self.scoring = parts.capture, parts.scoring
        self.tracer, self.transfer, self.window = parts.tracer, parts.transfer, parts.window
        self.grid, self.queries, self.rows = parts.grid, parts.queries, parts.rows
        self.source, self.ssm, self.spec = parts.source, parts.ssm, parts.spec
        self.spec_target, self.ahead, self.runner = parts.spec_target, parts.ahead, parts.runner
        self.recompute = parts.recompute
        self.cell_order = turn_cells(self.window, self.grid, self.config, self.tracer)
        self.last_query: QueryVectors | None = None
        self.frontier: int | None = None  # first position whose KV saw a chosen window
        self.force_spans: tuple[TokenSpan, ...] = ()  # oracle: spans every plan must hold
        self.last_turn = TurnStats()
        self.live_turn: TurnStats | None = None  # the turn being run (read by live timings)
        self._progress: Callable[[PrefillProgress], None] | None = None  # this turn's prefill
        self._spans = PromptSpans()  # the last turn's spans (its control text)

    @property
    def chunk_tokens(self) -> int:
        return self.grid.chunk_tokens

    @property
    def capacity(self) -> int:
        return self.window.capacity

    @property
    def last_plan(self):
        return self.window.last_plan

    @property
    def tokens(self) -> list[int]:
        return list(self.table.tokens)

    def reset(self) -> None:
        self.transfer.flush()  # no copy-out may land in the store after it is emptied
        self.ctx.clear()
        self.window.reset()
        self.table.truncate(0)
        self.store.drop(self.store.block_ids())
        if self.index is not None:
            self.index.remove(self.index.block_ids())
        self.last_query, self.frontier = None, None
        self.queries.clear()
        self.rows.clear()
        self.ssm.clear()

    # turns -----------------------------------------------------------------------------
    def generate(
        self,
        prompt: Sequence[int],
        *,
        query: PromptSpans | TokenSpan | None,
        sampling: SamplingParams,
        max_tokens: int = -1,
        grammar: str | None = None,
        cancel: threading.Event | None = None,
        logits_out: list[np.ndarray] | None = None,
        banned_tokens: Sequence[int] = (),
        progress: Callable[[PrefillProgress], None] | None = None,
    ) -> Iterator[int]:
        stats = self._start_turn(prompt)
        self._progress = progress  # told as the prefill starts and after each chunk
        sampler = Sampler(self.ctx.model.vocab, sampling, grammar, banned_tokens)
        gen = Generation(self.parts, self.spec, sampler, stats, max_tokens, cancel, logits_out)
        self.runner.cancel = cancel  # checked before each prefill/replay chunk
        try:
            self._prefill(prompt, PromptSpans.of(query), stats)
            yield from gen.tokens()
        except TurnCancelledError:
            gen.finish = FinishReason.CANCELLED  # the GEN record says so; the caller sees it
            raise
        finally:
            self.runner.cancel, self._progress = None, None
            sampler.close()
            self._finish(stats, len(prompt), gen.finish, gen.t0)

    def teacher_force(
        self,
        prompt: Sequence[int],
        continuation: Sequence[int],
        *,
        query: PromptSpans | TokenSpan | None,
    ) -> np.ndarray:
        """Logits predicting each continuation token: float32 [len(continuation), n_vocab]."""
        stats = self._start_turn(prompt)
        try:
            self._prefill(prompt, PromptSpans.of(query), stats)
            if not continuation:  # prefill only (max_tokens 0): the prompt's KV is kept
                return np.zeros((0, self.ctx.n_vocab), np.float32)
            rows = [self.ctx.logits(-1)]
            if len(continuation) > 1:
                gen_start = self.table.n_tokens
                more = list(continuation[:-1])
                rows += decode_tokens(
                    self.runner, more, stats, gen_start=gen_start, want_all_logits=True
                )
            stats.generated_tokens = len(continuation)
            return np.stack(rows[: len(continuation)]).astype(np.float32)  # [n_cont, n_vocab]
        finally:
            self._spill_frontier(stats, len(prompt))
            self._end_turn(stats, FinishReason.STOP)

    # the turn's stages -----------------------------------------------------------------
    def _start_turn(self, prompt: Sequence[int]) -> TurnStats:
        if not prompt:
            raise InvalidRequestError("the prompt is empty", param="messages")
        if len(prompt) >= self.n_ctx:
            raise ContextLengthExceededError(len(prompt), self.n_ctx)
        self.live_turn = TurnStats(prompt_tokens=len(prompt))
        return self.live_turn

    def _prefill(self, prompt: Sequence[int], given: PromptSpans, stats: TurnStats) -> None:
        t0 = time.perf_counter()
        n = len(prompt)
        if given.unlocated:  # the chat layer could not find them: retrieval goes without
            self.tracer.emit(TraceKind.SPANS_UNLOCATED, spans=given.unlocated, tokens=n)
        plan = self._plan(prompt, given)
        self._spans = plan.spans
        reused = self._reuse(plan, stats)
        self.window.note_groups(plan.spans.groups)  # evictions keep an image's blocks together
        if self.config.enabled and n > self.config.budget:
            bt, pin = self.table.block_tokens, self.config.query_pin_tokens
            self.ssm.plan_prefill(reused, n, plan.spans, pin, bt)
        stats.prefill_tokens = n - reused
        qvec, scored = self._prefill_query(prompt, plan, reused, stats)
        try:
            if self.config.enabled:
                self._reselect(plan.spans, qvec, n, stats, scored)
        finally:
            self.transfer.drop_ahead()  # a blob built ahead serves this turn's plan alone
        if plan.tail is not None:  # the tail, once, against the window chosen for its query
            decode_tokens(self.runner, list(prompt[plan.tail :]), stats)
            stats.deferred_tokens = n - plan.tail
            self._report_progress(stats)
            self.frontier = plan.tail
        self.ssm.end_prefill()
        early = self.config.restore_ahead is RestoreAheadMode.GENERATION
        if self.frontier is not None and early:  # the next turn goes on from here: its
            self._prepare_next_turn()  # restore, built beside the generation
        stats.prefill_ms = (time.perf_counter() - t0) * 1e3
        trace_prefill(self.tracer, n, reused, stats)

    def _plan(self, prompt: Sequence[int], given: PromptSpans) -> TurnPlan:
        n = len(prompt)
        inputs = TurnInputs(
            n,
            given,
            self.table.common_prefix(prompt),
            self.frontier,
            self.config,
            self.source.kind,
            self.ssm.active,
            self.grid,
        )

        def ranks(spans: PromptSpans, end: int) -> bool:
            request = self.window.request(spans, self.forced(), n - end, end)
            return bool(self.window.candidates(request))

        return plan_turn(inputs, ranks, self.rows.first_missing)

    def _reuse(self, plan: TurnPlan, stats: TurnStats) -> int:
        """Cut the history to the plan's reused prefix (on a hybrid: back to a recurrent
        snapshot at or before it); returns the tokens kept."""
        reused = plan.reused
        if reused < self.table.n_tokens:
            reused = self.ssm.rewind_to(reused)
            self._truncate(reused, stats)
        if self.runner.bounded:
            stats.add(self.cell_order.start_turn(reused, plan.spans))
        self.frontier = None
        stats.cached_tokens = reused
        stats.reprocessed_tokens = plan.common - reused
        self._report_progress(stats)
        return reused

    def _report_progress(self, stats: TurnStats) -> None:
        if self._progress is not None:
            done = self.table.n_tokens
            self._progress(PrefillProgress(stats.prompt_tokens, stats.cached_tokens, done))

    def _prefill_query(
        self, prompt: Sequence[int], plan: TurnPlan, reused: int, stats: TurnStats
    ) -> tuple[QueryVectors | None, BlockScores | None]:
        """Prefill [reused, plan.end) and gather the query of the wanted spans (and, when
        the query work went ahead, the plan's scores)."""
        kept = self.source.on_main(plan.wanted, plan.n)
        ahead = begin_ahead(self.ahead, prompt, plan, reused, self.forced(), stats)
        try:
            suffix = list(prompt[reused : plan.end])

            def on_chunk() -> None:  # the query work ahead, then the prompt's progress
                if ahead is not None:
                    ahead.poll()
                self._report_progress(stats)

            inside = ahead.poll if ahead is not None else None
            captured = prefill_chunks(
                self.runner, suffix, plan.spans, kept, stats, on_chunk, inside
            )
            if ahead is not None:
                captured = ahead.rows()
                self.transfer.profile.add(
                    TransferPath.SCORING_DECODE, ahead.rows_ms, calls=ahead.n_missing
                )
            else:
                captured = self.source.rows(prompt, plan.wanted, kept, captured, reused)
            qvec = self._query_vectors(plan, captured, prompt)
            return qvec, ahead.scores() if ahead is not None else None
        except BaseException:
            if ahead is not None:  # the worker may still use the scoring context and index
                ahead.settle()
            self.transfer.drop_ahead()
            raise

    def _query_vectors(
        self, plan: TurnPlan, captured: SpanRows, prompt: Sequence[int]
    ) -> QueryVectors | None:
        """Vectors of every wanted span: captured this turn, or kept from the turn that
        processed it (the same tokens at the same positions); those captured are kept."""
        wanted = plan.wanted
        missing = self.queries.keep(wanted, captured, prompt)
        for span in missing:
            logger.info("query span [%d, %d) has no vectors this turn", span.start, span.end)
        self.last_query = self.queries.joined(wanted, captured, prompt, plan.lexical)
        trace_query(self.tracer, len(prompt), wanted, self.last_query, missing)
        return self.last_query

    def _reselect(
        self,
        spans: PromptSpans,
        qvec: QueryVectors | None,
        n: int,
        stats: TurnStats,
        scored: BlockScores | None = None,
    ) -> None:
        pending = n - self.table.n_tokens  # the deferred tail
        if self.window.candidates(self.window.request(spans, self.forced(), pending)):
            stats.add(self.window.flush())  # the plan reads the index: every block in it
        res = self.window.plan(spans, qvec, n, self.forced(), pending, scored)
        stats.add(self.window.apply(res).moves)
        stats.add(self.recompute.apply(self.recompute.plan(res)))
        if res.replay_from is not None:
            self.frontier = self._replay(res.replay_from, stats)
        elif not res.plan.fits:
            self.frontier = n  # what is generated now sees the chosen window

    def forced(self) -> list[int]:
        """The blocks of the oracle's spans, which every plan holds."""
        bt = self.table.block_tokens
        return sorted({b for s in self.force_spans for b in s.blocks(bt)})

    def _replay(self, start: int, stats: TurnStats) -> int:
        """Re-decode the live tail from `start` against the window just applied; returns
        where the replay started (on a hybrid: the ReplaySSM snapshot at or before it)."""
        t0 = time.perf_counter()
        start = self.ssm.rewind_to(start)
        tokens = list(self.table.tokens[start:])
        stats.add(self.window.apply_cut(self.window.plan_cut(start, keep_window=True)))
        self.rows.truncate(start)  # the tail's rows from here see the new window
        decode_tokens(self.runner, tokens, stats)
        stats.replayed_tokens += len(tokens)
        stats.replay_ms += (time.perf_counter() - t0) * 1e3
        return start

    def _truncate(self, n_keep: int, stats: TurnStats) -> None:
        """Forget history from `n_keep` on (a divergence, or the frontier)."""
        stats.truncated_tokens += self.table.n_tokens - n_keep
        cut = self.window.plan_cut(n_keep, keep_window=False)
        stats.add(self.window.apply_cut(cut))
        self.rows.truncate(n_keep)
        self.tracer.emit(TraceKind.TRUNCATE, keep=n_keep, dropped_blocks=cut.dropped)

    # the turn's end --------------------------------------------------------------------
    def _finish(
        self, stats: TurnStats, n_prompt: int, finish: FinishReason, t0: float | None
    ) -> None:
        """A generation's end; `t0`: when its decoding started (None: it did not)."""
        self._spill_frontier(stats, n_prompt)
        self.ssm.take()  # the turn's end: where the next turn continues
        stats.decode_ms = 0.0 if t0 is None else (time.perf_counter() - t0) * 1e3
        self._end_turn(stats, finish)

    def _prepare_next_turn(self) -> None:
        """The next turn's first chunk restores the stream window its reselection left out:
        build those blobs now, off its path, for a turn that goes on from the frontier.
        Called once the prefill sets the frontier where `--kvmem-restore-ahead` builds
        beside the generation, and at the turn's end, which keeps that build when it
        predicts the same blocks."""
        if not self.runner.bounded:
            return
        n = self.table.n_tokens
        position = n if self.frontier is None else min(self.frontier, n)
        self.cell_order.prepare_next(position, self._spans)

    def _spill_frontier(self, stats: TurnStats, n_prompt: int) -> None:
        """Generated tokens that saw blocks leave (spill, eviction) are recomputed next turn."""
        if self.frontier is None and (stats.spilled_blocks or stats.evicted_blocks):
            self.frontier = min(n_prompt, self.table.n_tokens)

    def _end_turn(self, stats: TurnStats, finish: FinishReason) -> None:
        stats.add(self.window.flush())  # the turn's blocks are in the store when it ends
        self._prepare_next_turn()
        stats.finish_reason = finish.value
        self.last_turn = stats
        cells, host_blocks = self.window.cells_used(), len(self.store)
        trace_gen(self.tracer, stats, cells, host_blocks, self.spec is not None)
