"""KVMemSession: one conversation on a llama.cpp context with a bounded KV window.

The life of a turn: reuse the longest common prefix with the history (truncating after
a divergence), prefill the new suffix in chunks (harvesting completed blocks to the
host and evicting under pressure, capturing the query vectors), reselect the window
for the query, replay the query if the window changed, then generate with the reserve
(spilling this generation's oldest complete block when the reserve is full).
With KVMem disabled the same loop runs on a full-size context with nothing moved.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence

import numpy as np

from kvmem.config import KVMemConfig, QueryPolicy
from kvmem.errors import ContextLengthExceededError, InvalidRequestError
from kvmem.memory.block_table import BlockTable
from kvmem.memory.host_store import BlockStore, HostStore
from kvmem.memory.retrieval_index import RetrievalIndex
from kvmem.memory.scorer import QueryVectors

from .context import LlamaContext
from .kv_transfer import KVTransfer
from .query_capture import QueryCapture
from .sampler import Sampler, SamplingParams
from .trace import FinishReason, Tracer, TurnStats
from .window import GpuWindow, TokenSpan

logger = logging.getLogger(__name__)


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
    ) -> None:
        self.ctx = ctx
        self.config = config
        self.n_ctx = n_ctx
        self.table = BlockTable(config.block_tokens)
        self.store = HostStore() if store is None else store
        self.index = index
        self.capture = capture if config.enabled else None
        self.tracer = tracer
        self._is_eog = is_eog
        capacity = min(config.gpu_cells, ctx.n_cells) if config.enabled else ctx.n_cells
        self.transfer = KVTransfer(ctx, self.table, self.store, index)
        self.window = GpuWindow(ctx, self.table, self.transfer, index, config, capacity, tracer)
        protected = (config.sink_blocks + config.recent_blocks + 1) * config.block_tokens
        room = capacity - protected if config.enabled else capacity
        self.chunk_tokens = max(1, min(ctx.n_batch, room))
        self.last_query: QueryVectors | None = None
        self._query_key: tuple[int, tuple[int, ...]] | None = None
        self.last_turn = TurnStats()

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
        self.ctx.clear()
        self.transfer.forget()
        self.table.truncate(0)
        self.store.drop(self.store.block_ids())
        if self.index is not None:
            self.index.remove(self.index.block_ids())
        self.window.last_plan = None
        self.last_query, self._query_key = None, None

    # turns -----------------------------------------------------------------------------
    def generate(
        self,
        prompt: Sequence[int],
        *,
        query: TokenSpan | None,
        sampling: SamplingParams,
        max_tokens: int = -1,
        grammar: str | None = None,
        cancel: threading.Event | None = None,
        logits_out: list[np.ndarray] | None = None,
        banned_tokens: Sequence[int] = (),
    ) -> Iterator[int]:
        stats = self._start_turn(prompt)
        sampler = Sampler(self.ctx.model.vocab, sampling, grammar, banned_tokens)
        finish = FinishReason.STOP
        t0: float | None = None  # decode time also counts when the consumer closes us early
        try:
            self._prefill(prompt, query, stats)
            gen_start = self.table.n_tokens
            t0 = time.perf_counter()
            while True:
                if cancel is not None and cancel.is_set():
                    finish = FinishReason.CANCELLED
                    break
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
                self._decode([token], stats, want_all_logits=False, gen_start=gen_start)
        finally:
            sampler.close()
            stats.decode_ms = 0.0 if t0 is None else (time.perf_counter() - t0) * 1e3
            self._end_turn(stats, finish)

    def teacher_force(
        self, prompt: Sequence[int], continuation: Sequence[int], *, query: TokenSpan | None
    ) -> np.ndarray:
        """Logits predicting each continuation token: float32 [len(continuation), n_vocab]."""
        stats = self._start_turn(prompt)
        try:
            self._prefill(prompt, query, stats)
            rows = [self.ctx.logits(-1)]
            if len(continuation) > 1:
                rows += self._decode(
                    list(continuation[:-1]),
                    stats,
                    want_all_logits=True,
                    gen_start=self.table.n_tokens,
                )
            stats.generated_tokens = len(continuation)
            return np.stack(rows[: len(continuation)]).astype(np.float32)  # [n_cont, n_vocab]
        finally:
            self._end_turn(stats, FinishReason.STOP)

    # internals -------------------------------------------------------------------------
    def _start_turn(self, prompt: Sequence[int]) -> TurnStats:
        if not prompt:
            raise InvalidRequestError("the prompt is empty", param="messages")
        if len(prompt) >= self.n_ctx:
            raise ContextLengthExceededError(len(prompt), self.n_ctx)
        return TurnStats(prompt_tokens=len(prompt))

    def _end_turn(self, stats: TurnStats, finish: FinishReason) -> None:
        stats.finish_reason = finish.value
        self.last_turn = stats
        self.tracer.emit(
            "GEN",
            tokens=stats.generated_tokens,
            ms=stats.decode_ms,
            spilled=stats.spilled_blocks,
            finish=stats.finish_reason,
            cells=self.window.cells_used(),
            host_blocks=len(self.store),
        )

    def _prefill(self, prompt: Sequence[int], query: TokenSpan | None, stats: TurnStats) -> None:
        t0 = time.perf_counter()
        reused = min(self.table.common_prefix(prompt), len(prompt) - 1)
        if reused < self.table.n_tokens:
            self._truncate(reused, stats)
        stats.cached_tokens = reused
        span = self._clip_query(query, len(prompt))
        suffix = list(prompt[reused:])
        stats.prefill_tokens = len(suffix)
        captured = self._decode(suffix, stats, want_all_logits=False, capture=span)
        qvec = self._query_vectors(span, captured, prompt)
        if self.config.enabled:
            res = self.window.reselect(qvec, None if span is None else span.start, stats)
            if res.replay_from is not None:
                self._replay(res.replay_from, stats)
        stats.prefill_ms = (time.perf_counter() - t0) * 1e3
        self.tracer.emit(
            "PREFILL",
            tokens=len(prompt),
            reused=reused,
            new=len(suffix),
            replayed=stats.replayed_tokens,
            stage_in=stats.stage_in_blocks,
            stage_out=stats.stage_out_blocks,
            bytes_in=stats.stage_in_bytes,
            bytes_out=stats.stage_out_bytes,
            ms=stats.prefill_ms,
        )

    def _clip_query(self, query: TokenSpan | None, n_prompt: int) -> TokenSpan | None:
        """The query span by `--kvmem-query-policy`: the caller's span (the last user
        message) or the prompt's tail; at most `--kvmem-query-max-tokens` of its end."""
        if self.config.query_policy is QueryPolicy.TAIL:
            query = TokenSpan(0, n_prompt)
        if query is None or query.length == 0 or query.end > n_prompt:
            return None
        start = max(query.start, query.end - self.config.query_max_tokens)
        return TokenSpan(start, query.end)

    def _query_vectors(
        self, span: TokenSpan | None, captured: dict[int, np.ndarray], prompt: Sequence[int]
    ) -> QueryVectors | None:
        if span is None or self.capture is None:
            return None
        key = (span.start, tuple(prompt[span.start : span.end]))
        if captured and all(len(rows) == span.length for rows in captured.values()):
            self.last_query = QueryVectors(
                positions=np.arange(span.start, span.end, dtype=np.int64), by_layer=captured
            )
            self._query_key = key
        elif key != self._query_key:
            logger.info("query span [%d, %d) was not processed this turn", span.start, span.end)
            return None
        return self.last_query

    def _decode(
        self,
        tokens: list[int],
        stats: TurnStats,
        *,
        want_all_logits: bool,
        capture: TokenSpan | None = None,
        gen_start: int | None = None,
    ) -> list[np.ndarray] | dict[int, np.ndarray]:
        """Decode tokens after the history in chunks; logits of the last (or every) token."""
        rows: list[np.ndarray] = []
        captured: dict[int, list[np.ndarray]] = {}
        for c0 in range(0, len(tokens), self.chunk_tokens):
            chunk = tokens[c0 : c0 + self.chunk_tokens]
            pos = self.table.n_tokens
            if self.config.enabled:
                self.window.ensure_room(len(chunk), stats, gen_start)
            arm = (
                self.capture is not None
                and capture is not None
                and (pos < capture.end and pos + len(chunk) > capture.start)
            )
            if arm:
                self.capture.arm()
            try:
                last = c0 + len(chunk) == len(tokens)
                flags = [want_all_logits] * len(chunk)
                flags[-1] = flags[-1] or last
                self.ctx.decode(chunk, pos, flags)
            finally:
                got = self.capture.disarm() if arm else {}
            for layer, data in got.items():
                lo, hi = max(capture.start, pos) - pos, min(capture.end, pos + len(chunk)) - pos
                captured.setdefault(layer, []).append(data[lo:hi])
            if want_all_logits:
                rows += [self.ctx.logits(i) for i in range(len(chunk))]
            self._append(chunk, stats)
        if capture is not None:
            return {k: np.concatenate(v) for k, v in captured.items()}
        return rows

    def _append(self, tokens: Sequence[int], stats: TurnStats) -> None:
        done = self.table.append(tokens)
        self.table.mark_on_gpu(done)
        if self.config.enabled and done:
            res = self.transfer.harvest(done)
            stats.stage_out_blocks += res.blocks
            stats.stage_out_bytes += res.bytes
            stats.harvest_ms += res.ms
        self.window.note_peak()

    def _replay(self, start: int, stats: TurnStats) -> None:
        t0 = time.perf_counter()
        tokens = list(self.table.tokens[start:])
        self.window.drop_from(start)
        self.table.truncate(start)
        self._decode(tokens, stats, want_all_logits=False)
        stats.replayed_tokens += len(tokens)
        stats.replay_ms += (time.perf_counter() - t0) * 1e3

    def _truncate(self, n_keep: int, stats: TurnStats) -> None:
        """Forget history from `n_keep` on (a divergence); the token before stays on the GPU."""
        stats.truncated_tokens += self.table.n_tokens - n_keep
        self.window.drop_from(n_keep)
        if n_keep > 0:
            self.window.ensure_block_on_gpu((n_keep - 1) // self.table.block_tokens, stats)
            self.window.drop_from(n_keep)
        result = self.table.truncate(n_keep)
        self.store.drop(result.dropped_blocks)
        if self.index is not None:
            self.index.remove(result.dropped_blocks)
        if self.last_plan is not None and self.window.last_plan is not None:
            self.window.last_plan = None
        self.tracer.emit("TRUNCATE", keep=n_keep, dropped_blocks=result.dropped_blocks)
