"""The scoring source's query rows and block scores, computed beside the prefill.

With `--kvmem-query-source scoring` the query's rows come from the scoring context, which
needs the prompt's tokens only, and the blocks a plan will score follow from the request
before any chunk is decoded (`GpuWindow.candidates`). So the scoring context's worker
thread decodes the query spans while the main context prefills (llama_decode releases the
GIL; the two contexts share only the model's weights), then scores the candidates once
every one of them is harvested (`GpuWindow.score`, which waits only for their summaries
and reads nothing the prefill writes). The plan after the prefill then only picks.

Nothing depends on timing: the rows are a function of the tokens, and a score of its
candidates and its query alone, so the window is the one `--kvmem-query-ahead off`
computes after the prefill, on the turn's own thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import replace

import numpy as np

from kvmem.memory.block_table import BlockTable
from kvmem.memory.spans import TokenSpan

from .block_scores import BlockScores

logger = logging.getLogger(__name__)

Rows = dict[TokenSpan, dict[int, np.ndarray]]  # span -> layer -> [length, n_head, head_dim]


class QueryAhead:
    """One prefill's query work on the worker: the rows at once, then the scores once every
    candidate block is harvested (`poll`, after each chunk); the worker runs them in that
    order."""

    def __init__(
        self,
        worker: ThreadPoolExecutor,
        rows: Callable[[], Rows],
        n_missing: int,
        ranked: tuple[int, ...],
        score: Callable[[Rows], BlockScores | None],
        table: BlockTable,
        flush: Callable[[], None],
        prepare: Callable[[BlockScores], object] | None = None,
    ) -> None:
        """Decode the rows (`rows`, `n_missing` spans) at once; score `ranked` with `score`
        once `table` holds them all complete, `flush` handing the blocks still waiting for
        their harvest, and the last copy-out's, to the index first; hand the scores, once
        computed, to `prepare` (on the polling thread). Polls at once: the candidates may
        all be harvested already."""
        self._worker = worker
        self.n_missing = n_missing  # query spans the scoring context decodes
        self.rows_ms = 0.0  # the scoring context's decode, on the worker
        self._rows: Future[Rows] = worker.submit(self._timed_rows, rows)
        self._ranked, self._score, self._table, self._flush = ranked, score, table, flush
        self._scores: Future[BlockScores | None] | None = None
        self.scores_from = -1  # the history length when the scores were started
        self._prepare = prepare  # None once called (or never to be)
        self.poll()

    def _timed_rows(self, rows: Callable[[], Rows]) -> Rows:
        t0 = time.perf_counter()
        try:
            return rows()
        finally:
            self.rows_ms = (time.perf_counter() - t0) * 1e3

    def poll(self) -> None:
        """Start the scores if every candidate block is complete, and hand them to
        `prepare` once they are computed (each once per turn)."""
        if self._scores is not None:
            self._prepared()
            return
        if not self._ranked:
            return
        if self._table.n_complete_blocks <= max(self._ranked):
            return
        self._flush()
        score, self.scores_from = self._score, self._table.n_tokens
        self._scores = self._worker.submit(lambda: score(self._rows.result()))

    def _prepared(self) -> None:
        """`prepare` the scores if they are ready (a failed score is raised by `scores`)."""
        job, prepare = self._scores, self._prepare
        if prepare is None or job is None or not job.done() or job.exception() is not None:
            return
        self._prepare = None
        got = job.result()
        if got is not None:
            prepare(got)

    def rows(self) -> Rows:
        return self._rows.result()

    def scores(self) -> BlockScores | None:
        """The scores computed ahead (None: not started, or no query), with the time the
        turn waited for them; scores that came after the last poll are `prepare`d now, so
        their restore is built while the plan harvests and evicts (the wait counts the
        build's start: on the turn's path too)."""
        if self._scores is None:
            return None
        t0 = time.perf_counter()
        got = self._scores.result()
        if got is None:
            return None
        self._prepared()
        return replace(got, wait_ms=(time.perf_counter() - t0) * 1e3, ahead_at=self.scores_from)

    def settle(self) -> None:
        """Wait for the worker's jobs, whatever they give (the turn failed): the scoring
        context and the index are free again once this returns."""
        futures = [f for f in (self._rows, self._scores) if f is not None]
        wait(futures)
        for f in futures:
            if f.exception() is not None:
                logger.info("query work ahead of a failed turn: %s", f.exception())
