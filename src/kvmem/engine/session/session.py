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

import collections
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from kvmem.config import KVMemConfig, QueryAheadMode, QueryPolicy, QueryReplay
from kvmem.errors import ContextLengthExceededError, InvalidRequestError, TurnCancelledError
from kvmem.memory.block_table import BlockTable
from kvmem.memory.exact_scorer import RankMode
from kvmem.memory.host_store import BlockStore, HostStore
from kvmem.memory.query_rows import QueryRows, merged
from kvmem.memory.retrieval_index import RetrievalIndex
from kvmem.memory.scorer import QueryVectors
from kvmem.memory.spans import PromptSpans, TokenSpan
from kvmem.sampling import SamplingParams

from ..hybrid.replay_ssm import ReplaySSM
from ..llama.context import LlamaContext
from ..llama.host_staging import STAGING_BYTES
from ..llama.sampler import Sampler
from ..query.query_ahead import QueryAhead, Rows
from ..query.query_capture import QueryCapture
from ..query.scoring_context import ScoringContext
from ..spec.spec_decode import SpecDecoder
from ..trace import FinishReason, TraceKind, Tracer, TurnStats
from ..transfer.kv_transfer import KVTransfer
from ..transfer.transfer_profile import TransferPath
from .spec_target import SpecTarget
from .window import BlockScores, GpuWindow, StreamAt

logger = logging.getLogger(__name__)

_QUERY_CACHE = 8  # query spans whose vectors are kept for later turns


class KVMemSession:
    def __init__(
        self,
        ctx: LlamaContext,
        config: KVMemConfig,
        n_ctx: int,
        index: RetrievalIndex | None,
        capture: QueryCapture | None,
        tracer: Tracer,
        is_eog,
        store: BlockStore | None = None,  # the block store; None: a RAM HostStore
        staging_bytes: int = STAGING_BYTES,  # the transfers' reused blob buffer; 0 = none
        spec: SpecDecoder | None = None,  # speculative decoding (spec_decode.py)
        scoring: ScoringContext | None = None,  # --kvmem-query-source scoring
    ) -> None:
        self.ctx = ctx
        self.config = config
        self.n_ctx = n_ctx
        self.table = BlockTable(config.block_tokens)
        self.store = HostStore() if store is None else store
        self.index = index
        self.capture = capture if config.enabled else None  # on the main context
        self.scoring = scoring if config.enabled else None  # or on a context of its own
        self.tracer = tracer
        self._is_eog = is_eog
        capacity = min(config.gpu_cells, ctx.n_cells) if config.enabled else ctx.n_cells
        self.transfer = KVTransfer(ctx, self.table, self.store, index, staging_bytes)
        self.window = GpuWindow(ctx, self.table, self.transfer, index, config, capacity, tracer)
        self.chunk_tokens = self._chunk_size(capacity)
        self.last_query: QueryVectors | None = None
        self._queries: collections.OrderedDict[tuple, QueryVectors] = collections.OrderedDict()
        self.rows = QueryRows()  # the main context's query rows, by position (query_rows.py)
        self.frontier: int | None = None  # first position whose KV saw a chosen window
        self.force_spans: tuple[TokenSpan, ...] = ()  # oracle: spans every plan must hold
        self.last_turn = TurnStats()
        self.live_turn: TurnStats | None = None  # the turn being run (read by live timings)
        self._cancel: threading.Event | None = None
        self.ssm = ReplaySSM(ctx) if ctx.model.is_hybrid else None  # recurrent snapshots
        self.spec = spec
        self.spec_target = SpecTarget(ctx, n_ctx, self.table, self.window, config.enabled)

    def _chunk_size(self, capacity: int) -> int:
        """Prefill chunk: a multiple (or, for a small batch, a divisor) of the block size
        that leaves room for the window and fits the batch."""
        if not self.config.enabled:
            return max(1, min(self.ctx.n_batch, capacity))
        bt = self.config.block_tokens
        protected = (self.config.sink_blocks + self.config.recent_blocks + 1) * bt
        limit = max(1, min(self.ctx.n_batch, capacity - protected))
        if limit >= bt:
            return limit - limit % bt
        # a batch smaller than a block: the largest divisor of the block size that fits,
        # so that every block boundary is still a chunk boundary
        return max(d for d in range(1, limit + 1) if bt % d == 0)

    @property
    def stream_grid(self) -> int:
        """The absolute chunk grid whose starts fix a prefill chunk's stream window: the
        chunk size, or the block size for chunks smaller than a block."""
        return max(self.chunk_tokens, self.table.block_tokens)

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
        self._queries.clear()
        self.rows.clear()
        if self.ssm is not None:
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
    ) -> Iterator[int]:
        self._cancel = cancel  # checked before each prefill/replay chunk (_decode)
        stats = self._start_turn(prompt)
        sampler = Sampler(self.ctx.model.vocab, sampling, grammar, banned_tokens)
        finish = FinishReason.STOP
        t0: float | None = None  # decode time also counts when the consumer closes us early
        self._cancel = cancel
        try:
            self._prefill(prompt, PromptSpans.of(query), stats)
            gen_start = self.table.n_tokens
            t0 = time.perf_counter()
            queue: list[int] = []  # tokens a draft verification emitted, not yet yielded
            while True:
                if cancel is not None and cancel.is_set():
                    finish = FinishReason.CANCELLED
                    break
                if queue:
                    token = queue.pop(0)
                else:
                    if logits_out is not None:
                        logits_out.append(self.ctx.logits(-1))
                    token = sampler.sample(self.ctx.ptr, -1)
                if self._is_eog(token):
                    break
                finish = FinishReason.CANCELLED  # if the consumer stops at this yield
                yield token
                stats.generated_tokens += 1
                finish = FinishReason.STOP
                if stats.generated_tokens == max_tokens or self.table.n_tokens + 1 >= self.n_ctx:
                    finish = FinishReason.LENGTH
                    break
                if queue:
                    continue  # an accepted draft token: its cell is in the cache already
                if self.spec is not None:
                    left = -1 if max_tokens < 0 else max_tokens - stats.generated_tokens
                    queue = self.spec.step(
                        self.spec_target,
                        sampler,
                        token,
                        stats,
                        gen_start,
                        left,
                        logits_out,
                        self._is_eog,
                    )
                else:
                    self._decode([token], stats, gen_start=gen_start)
        except TurnCancelledError:
            finish = FinishReason.CANCELLED  # the GEN record says so; the caller sees the error
            raise
        finally:
            self._cancel = None
            sampler.close()
            self._spill_frontier(stats, len(prompt))
            if self.ssm is not None:
                self.ssm.take()  # the turn's end: where the next turn continues
            stats.decode_ms = 0.0 if t0 is None else (time.perf_counter() - t0) * 1e3
            self._end_turn(stats, finish)

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
            rows = [self.ctx.logits(-1)]
            if len(continuation) > 1:
                gen_start = self.table.n_tokens
                rows += self._decode(
                    list(continuation[:-1]), stats, want_all_logits=True, gen_start=gen_start
                )
            stats.generated_tokens = len(continuation)
            return np.stack(rows[: len(continuation)]).astype(np.float32)  # [n_cont, n_vocab]
        finally:
            self._spill_frontier(stats, len(prompt))
            self._end_turn(stats, FinishReason.STOP)

    # internals -------------------------------------------------------------------------
    def _start_turn(self, prompt: Sequence[int]) -> TurnStats:
        if not prompt:
            raise InvalidRequestError("the prompt is empty", param="messages")
        if len(prompt) >= self.n_ctx:
            raise ContextLengthExceededError(len(prompt), self.n_ctx)
        self.live_turn = TurnStats(prompt_tokens=len(prompt))
        return self.live_turn

    def _end_turn(self, stats: TurnStats, finish: FinishReason) -> None:
        self.window.flush(stats)  # the turn's blocks are in the store when it ends
        stats.finish_reason = finish.value
        self.last_turn = stats
        self.tracer.emit(
            TraceKind.GEN,
            tokens=stats.generated_tokens,
            ms=stats.decode_ms,
            spilled=stats.spilled_blocks,
            finish=stats.finish_reason,
            cells=self.window.cells_used(),
            host_blocks=len(self.store),
            **(
                {"draft_n": stats.draft_n, "draft_accepted": stats.draft_n_accepted}
                if self.spec is not None
                else {}
            ),
        )

    def _prefill(self, prompt: Sequence[int], given: PromptSpans, stats: TurnStats) -> None:
        t0 = time.perf_counter()
        n = len(prompt)
        if given.unlocated:  # the chat layer could not find them: retrieval goes without
            self.tracer.emit(TraceKind.SPANS_UNLOCATED, spans=given.unlocated, tokens=n)
        spans = self._resolve_spans(given, n)
        tail = self._deferred_start(spans, n)
        common = min(self.table.common_prefix(prompt), n - 1)
        reused = common if self.frontier is None else min(common, self.frontier)
        if tail is not None:
            reused = min(reused, tail)  # a fresh server decodes the tail after the plan
        reused = self._recompute_rows_from(spans, n, reused)
        if reused < self.table.n_tokens:
            if self.ssm is not None:  # back to a recurrent snapshot at or before the cut
                reused = self.ssm.rewind_to(reused)
            self._truncate(reused, stats)
        self.frontier = None
        stats.cached_tokens = reused
        stats.reprocessed_tokens = common - reused
        self.window.note_groups(spans.groups)  # evictions keep an image's blocks together
        end = n if tail is None else tail  # where the plan is made
        wanted = self._capture_spans(spans, n, end)
        if self.ssm is not None and self.config.enabled and n > self.config.budget:
            bt, pin = self.table.block_tokens, self.config.query_pin_tokens
            self.ssm.plan_prefill(reused, n, spans, pin, bt)
        suffix = list(prompt[reused:] if tail is None else prompt[reused:tail])
        stats.prefill_tokens = n - reused
        on_main = self._kept_spans(wanted, n) if self.scoring is None else ()
        ahead = self._begin_ahead(prompt, spans, wanted, (reused, end), stats)
        try:
            on_chunk = ahead.poll if ahead is not None else None
            captured = self._decode(suffix, stats, capture=on_main, spans=spans, on_chunk=on_chunk)
            if ahead is not None:
                captured = ahead.rows()
                self.transfer.profile.add(
                    TransferPath.SCORING_DECODE, ahead.rows_ms, calls=ahead.n_missing
                )
            elif self.scoring is not None:
                captured = self._score_apart(wanted, prompt)
            else:
                captured = self._keep_rows(on_main, captured, reused, wanted)
            qvec = self._query_vectors(wanted, captured, prompt)
            scored = ahead.scores() if ahead is not None else None
        except BaseException:
            if ahead is not None:  # the worker may still use the scoring context and index
                ahead.settle()
            self.transfer.drop_ahead()
            raise
        try:
            if self.config.enabled:
                self._reselect(spans, qvec, n, stats, scored)
        finally:
            self.transfer.drop_ahead()  # a blob built ahead serves this turn's plan alone
        if tail is not None:  # the tail, once, against the window chosen for its query
            self._decode(list(prompt[tail:]), stats)
            stats.deferred_tokens = n - tail
            self.frontier = tail
        if self.ssm is not None:
            self.ssm.end_prefill()
        stats.prefill_ms = (time.perf_counter() - t0) * 1e3
        self.tracer.emit(
            TraceKind.PREFILL,
            tokens=n,
            reused=reused,
            reprocessed=stats.reprocessed_tokens,
            new=n - reused,
            deferred=stats.deferred_tokens,
            replayed=stats.replayed_tokens,
            stage_in=stats.stage_in_blocks,
            harvested=stats.harvested_blocks,
            bytes_in=stats.stage_in_bytes,
            harvested_bytes=stats.harvested_bytes,
            ms=stats.prefill_ms,
        )

    def _reselect(
        self,
        spans: PromptSpans,
        qvec: QueryVectors | None,
        n: int,
        stats: TurnStats,
        scored: BlockScores | None = None,
    ) -> None:
        self.window.flush(stats)  # the plan reads the index: every complete block in it
        pending = n - self.table.n_tokens  # the deferred tail
        res = self.window.plan(spans, qvec, n, self._forced(), pending, scored)
        self.window.apply(res, stats)
        if res.replay_from is not None:
            self.frontier = self._replay(res.replay_from, stats)
        elif not res.plan.fits:
            self.frontier = n  # what is generated now sees the chosen window

    def _forced(self) -> list[int]:
        """The blocks of the oracle's spans, which every plan holds."""
        bt = self.table.block_tokens
        return sorted({b for s in self.force_spans for b in s.blocks(bt)})

    def _begin_ahead(
        self,
        prompt: Sequence[int],
        spans: PromptSpans,
        wanted: tuple[TokenSpan, ...],
        prefill: tuple[int, int],
        stats: TurnStats,
    ) -> QueryAhead | None:
        """Start the scoring source's query work beside the prefill of `prefill` (start,
        end) (`query_ahead.py`), and the restore blobs of the plan once it is scored, or
        None: another source, `--kvmem-query-ahead off`, a hybrid (snapshots of its own) or
        images (the projector is shared with the main context)."""
        c = self.config
        if self.scoring is None or c.query_ahead is QueryAheadMode.OFF:
            return None
        if self.ssm is not None or spans.groups or not wanted:
            return None
        missing = [s for s in wanted if query_key(s, prompt) not in self._queries]
        scoring, window = self.scoring, self.window
        start, end = prefill
        request = window.request(spans, self._forced(), len(prompt) - end, end)
        ranked: tuple[int, ...] = ()
        if self.index is not None and c.rank is RankMode.SUMMARY:  # the others read the store
            ranked = window.candidates(request)
        stream = None  # the window the last chunk sees (None: no chunk before the plan)
        if start < end:
            last = max(start, (end - 1) - (end - 1) % self.chunk_tokens)
            stream = StreamAt(last, spans, self.capacity - self.chunk_tokens, self.stream_grid)

        def score(rows: Rows) -> BlockScores | None:
            query = self.joined_query(wanted, rows, prompt)
            return None if query is None else window.score(ranked, query)

        return QueryAhead(
            scoring.worker,
            lambda: scoring.query_rows(prompt, missing),
            len(missing),
            ranked,
            score,
            self.table,
            lambda: self.window.flush(stats),
            lambda scores: window.prepare_restore(request, scores, stream),
        )

    def _deferred_start(self, spans: PromptSpans, n: int) -> int | None:
        """Where the prompt's tail starts when it is decoded only after the window is
        chosen for it, or None. With `--kvmem-query-source scoring` the query vectors come
        from the scoring context, so the tail that would be replayed against the chosen
        window (the pinned query, from the last message on) is decoded once, after the
        plan, instead of twice. Block-aligned, so every block before it is complete when
        the plan is made; a function of the request alone. Not for a prompt that fits the
        budget (nothing is chosen), nor on a hybrid or with images (their prefill has
        checkpoints and groups of its own)."""
        if self.scoring is None or self.ssm is not None or spans.groups:
            return None
        if n <= self.config.budget or self.config.query_replay is QueryReplay.OFF:
            return None
        bt = self.table.block_tokens
        live = spans.live.start if spans.live is not None else 0
        start = max(live, n - self.config.query_pin_tokens, 1)
        start -= start % bt
        return start if 0 < start < n else None

    def _spill_frontier(self, stats: TurnStats, n_prompt: int) -> None:
        """Generated tokens that saw blocks leave (spill, eviction) are recomputed next turn."""
        if self.frontier is None and (stats.spilled_blocks or stats.evicted_blocks):
            self.frontier = min(n_prompt, self.table.n_tokens)

    def _resolve_spans(self, given: PromptSpans, n: int) -> PromptSpans:
        """The spans by `--kvmem-query-policy`: `tail` scores the prompt's tail; `user` and
        `agent` the task (and `agent` the trajectory's tail too); with no user message the
        query is the prompt's own tail."""
        spans = given.clipped(n)
        tail = TokenSpan(max(0, n - self.config.query_max_tokens), n)
        if self.config.query_policy is QueryPolicy.TAIL or spans.query is None:
            return PromptSpans(
                spans.control, tail, spans.trajectory, spans.live or tail, spans.groups
            )
        return spans

    def _capture_spans(self, spans: PromptSpans, n: int, end: int) -> tuple[TokenSpan, ...]:
        """The token spans whose query vectors score the blocks of the plan made at `end`.
        None when that plan ranks nothing (everything fits) and the rows come from the
        scoring context: they are a function of the tokens, computed when a plan needs them.
        The main context's rows are captured regardless: a later turn cannot recompute
        them for a span it does not decode."""
        if (self.capture is None and self.scoring is None) or spans.query is None:
            return ()
        if self.scoring is not None and not self._ranks_at(spans, n, end):
            return ()
        q = self.config.query_max_tokens
        out = [spans.query.last(q)]
        if self.config.query_policy is QueryPolicy.AGENT and spans.trajectory is not None:
            traj = spans.trajectory.last(q)
            if traj.length and traj != out[0]:
                out.append(traj)
        return tuple(out)

    def _kept_spans(self, wanted: tuple[TokenSpan, ...], n: int) -> tuple[TokenSpan, ...]:
        """What the main context captures and keeps: the wanted spans and the prompt's tail
        (the next turns' trajectory tail covers it), as disjoint spans."""
        if self.capture is None or not wanted:
            return ()
        tail = TokenSpan(max(0, n - self.config.query_max_tokens), n)
        return tuple(merged((*wanted, tail)))

    def _keep_rows(
        self,
        kept: tuple[TokenSpan, ...],
        captured: Rows,
        reused: int,
        wanted: tuple[TokenSpan, ...],
    ) -> dict[TokenSpan, dict[int, np.ndarray]]:
        """Keep the rows captured this turn (from `reused` on) with those of earlier turns,
        forget the rest, and assemble every wanted span that has all of its rows."""
        for span in kept:
            if span in captured:
                self.rows.add(max(span.start, reused), captured[span])
        self.rows.keep_only(kept)
        return {s: v.by_layer for s in wanted if (v := self.rows.vectors(s)) is not None}

    def _recompute_rows_from(self, spans: PromptSpans, n: int, reused: int) -> int:
        """Where the prefill starts so that the plan has the main context's rows of every
        wanted span: `reused`, or the first position of a wanted span with no kept row (the
        tokens of an earlier turn's generation; a session loaded or switched back), at most
        `--kvmem-query-max-tokens` back. A span further back goes without (the QUERY
        trace says so)."""
        if self.capture is None or self.scoring is not None or not self._ranks_at(spans, n, n):
            return reused
        lacking = (self.rows.first_missing(s, reused) for s in self._capture_spans(spans, n, n))
        near = [p for p in lacking if p is not None and reused - p <= self.config.query_max_tokens]
        return min(near, default=reused)

    def _ranks_at(self, spans: PromptSpans, n: int, end: int) -> bool:
        """Whether the plan made with the history at `end` (of `n` prompt tokens) ranks
        any block by score."""
        window = self.window
        return bool(window.candidates(window.request(spans, self._forced(), n - end, end)))

    def _score_apart(
        self, wanted: tuple[TokenSpan, ...], prompt: Sequence[int]
    ) -> dict[TokenSpan, dict[int, np.ndarray]]:
        """The wanted spans' rows from the scoring context, for spans not kept from an
        earlier turn (the same tokens at the same positions give the same rows)."""
        assert self.scoring is not None
        missing = [s for s in wanted if query_key(s, prompt) not in self._queries]
        t0 = time.perf_counter()
        rows = self.scoring.query_rows(prompt, missing)
        if missing:
            self.transfer.profile.add(
                TransferPath.SCORING_DECODE, (time.perf_counter() - t0) * 1e3, calls=len(missing)
            )
        return rows

    def _query_vectors(
        self, wanted: tuple[TokenSpan, ...], captured: Rows, prompt: Sequence[int]
    ) -> QueryVectors | None:
        """Vectors of every wanted span: captured this turn, or kept from the turn that
        processed it (the same tokens at the same positions); those captured are kept."""
        missing = []
        for span in wanted:
            key = query_key(span, prompt)
            got = span_query(span, captured.get(span, {}))
            if got is not None:
                self._queries[key] = got
                del_oldest(self._queries, _QUERY_CACHE)
            if key in self._queries:
                self._queries.move_to_end(key)
            else:
                missing.append(span)
                logger.info("query span [%d, %d) has no vectors this turn", span.start, span.end)
        self.last_query = self.joined_query(wanted, captured, prompt)
        if wanted:
            self.tracer.emit(
                TraceKind.QUERY,
                at=len(prompt),
                spans=",".join(f"{s.start}-{s.end}" for s in wanted),
                tokens=0 if self.last_query is None else len(self.last_query.positions),
                missing=",".join(f"{s.start}-{s.end}" for s in missing) or "-",
            )
        return self.last_query

    def joined_query(
        self, wanted: tuple[TokenSpan, ...], captured: Rows, prompt: Sequence[int]
    ) -> QueryVectors | None:
        """The query of the wanted spans, from `captured` or the kept vectors; reads only
        (a worker thread calls it while the prefill runs)."""
        parts = []
        for span in wanted:
            got = span_query(span, captured.get(span, {}))
            got = got if got is not None else self._queries.get(query_key(span, prompt))
            if got is not None:
                parts.append(got)
        return join_queries(parts)

    def _decode(
        self,
        tokens: list[int],
        stats: TurnStats,
        *,
        want_all_logits: bool = False,
        capture: tuple[TokenSpan, ...] = (),
        spans: PromptSpans | None = None,
        gen_start: int | None = None,
        on_chunk: Callable[[], None] | None = None,
    ) -> list[np.ndarray] | dict[TokenSpan, dict[int, np.ndarray]]:
        """Decode tokens after the history: as prefill (`spans` given: block-aligned chunks
        that see the stream window) or after the window was chosen (replay, generation).
        `on_chunk` runs after each chunk is recorded (the query work ahead)."""
        rows: list[np.ndarray] = []
        captured: dict[TokenSpan, dict[int, list[np.ndarray]]] = {}
        c0 = 0
        prof = self.transfer.profile if spans is not None else None  # prefill: time the loop
        while c0 < len(tokens):
            t_loop = time.perf_counter()
            pos = self.table.n_tokens
            size = (
                self.chunk_tokens - pos % self.chunk_tokens
                if spans is not None
                else self.chunk_tokens
            )
            if self.ssm is not None and spans is not None:
                size = self.ssm.chunk_size(pos, size)  # stop at a ReplaySSM snapshot point
            chunk = tokens[c0 : c0 + size]
            if gen_start is None and self._cancel is not None and self._cancel.is_set():
                raise TurnCancelledError("the turn was cancelled during prompt processing")
            if self.config.enabled and spans is not None:
                room, grid = self.capacity - self.chunk_tokens, self.stream_grid
                self.window.stream_to(pos, spans, room, grid, stats)
            elif self.config.enabled:
                self.window.ensure_room(len(chunk), stats, gen_start)
            self.window.note_decode()
            live = [s for s in capture if pos < s.end and pos + len(chunk) > s.start]
            last = c0 + len(chunk) == len(tokens)
            t_decode = time.perf_counter()
            got = self._decode_chunk(chunk, pos, want_all_logits, last, bool(live))
            decode_ms = (time.perf_counter() - t_decode) * 1e3
            for span in live:
                lo, hi = max(span.start, pos) - pos, min(span.end, pos + len(chunk)) - pos
                for layer, data in got.items():
                    captured.setdefault(span, {}).setdefault(layer, []).append(data[lo:hi])
            if want_all_logits:
                rows += [self.ctx.logits(i) for i in range(len(chunk))]
            self.window.append(chunk, stats)
            if self.ssm is not None:
                self.ssm.after_decode(self.table.n_tokens)
            if on_chunk is not None:
                on_chunk()
            c0 += len(chunk)
            if prof is not None:
                prof.add(TransferPath.PREFILL_DECODE, decode_ms)
                loop_ms = (time.perf_counter() - t_loop) * 1e3
                prof.add(TransferPath.PREFILL_GAP, loop_ms - decode_ms)
        if spans is not None:
            return {s: {k: np.concatenate(v) for k, v in d.items()} for s, d in captured.items()}
        return rows

    def _decode_chunk(
        self, chunk: list[int], pos: int, want_all: bool, last: bool, arm: bool
    ) -> dict[int, np.ndarray]:
        arm = arm and self.capture is not None
        if arm:
            self.capture.arm(len(chunk))
        try:
            flags = [want_all] * len(chunk)
            flags[-1] = flags[-1] or last
            self.ctx.decode(chunk, pos, flags)
        finally:
            got = self.capture.disarm() if arm else {}
        return got

    def _replay(self, start: int, stats: TurnStats) -> int:
        """Re-decode the live tail from `start` against the window just applied; returns
        where the replay started (on a hybrid: the ReplaySSM snapshot at or before it)."""
        t0 = time.perf_counter()
        if self.ssm is not None:
            start = self.ssm.rewind_to(start)
        tokens = list(self.table.tokens[start:])
        self.window.truncate(start, stats, keep_window=True)
        self.rows.truncate(start)  # the tail's rows from here see the new window
        self._decode(tokens, stats)
        stats.replayed_tokens += len(tokens)
        stats.replay_ms += (time.perf_counter() - t0) * 1e3
        return start

    def _truncate(self, n_keep: int, stats: TurnStats) -> None:
        """Forget history from `n_keep` on (a divergence, or the frontier)."""
        stats.truncated_tokens += self.table.n_tokens - n_keep
        dropped = self.window.truncate(n_keep, stats, keep_window=False)
        self.rows.truncate(n_keep)
        self.tracer.emit(TraceKind.TRUNCATE, keep=n_keep, dropped_blocks=dropped)


def query_key(span: TokenSpan, prompt: Sequence[int]) -> tuple[int, tuple[int, ...]]:
    """The query-vector cache's key: a span's vectors are the same for the same tokens at
    the same positions."""
    return span.start, tuple(prompt[span.start : span.end])


def del_oldest(cache: collections.OrderedDict, size: int) -> None:
    while len(cache) > size:
        cache.popitem(last=False)


def span_query(span: TokenSpan, rows: dict[int, np.ndarray]) -> QueryVectors | None:
    """A span's vectors from its rows of this turn, or None when they are not all there."""
    if not rows or any(len(r) != span.length for r in rows.values()):
        return None
    positions = np.arange(span.start, span.end, dtype=np.int64)  # [n_tokens]
    return QueryVectors(positions=positions, by_layer=rows)


def join_queries(parts: Sequence[QueryVectors]) -> QueryVectors | None:
    """One query of several spans' vectors (the layers every part has)."""
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0]
    layers = set.intersection(*(set(p.by_layer) for p in parts))
    return QueryVectors(
        positions=np.concatenate([p.positions for p in parts]),  # [n_tokens]
        by_layer={k: np.concatenate([p.by_layer[k] for p in parts]) for k in sorted(layers)},
    )
