"""A retrieval index whose block summaries are computed off the prefill's critical path.

Summarizing a harvested block (dequantize K, undo the Hadamard rotation, remove RoPE,
average) is numpy work that does not need the GPU. `BackgroundIndex.add_blocks` hands it
to worker threads (numpy releases the GIL), a batch split into one slice per worker, so
the next prefill chunk runs on the GPU meanwhile. Every read (membership, removal) first
waits for the pending summaries and stores them in submission order, so readers see
exactly what a synchronous index would hold; scoring waits only for the blocks it scores
(`score_table(ids)`), which a score cannot tell apart (`scorer` gathers its candidates'
rows). Adding may go on from one thread while another waits for and scores blocks.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from kvmem.memory.retrieval_index import BlockKeys, KeyGeometry, RetrievalIndex

logger = logging.getLogger(__name__)


class BackgroundIndex(RetrievalIndex):
    """RetrievalIndex with asynchronous `add_blocks` (workers = 0: synchronous)."""

    def __init__(self, geometry: KeyGeometry, layers: Sequence[int], workers: int = 1) -> None:
        super().__init__(geometry, layers)
        self.workers = workers
        self._pool = ThreadPoolExecutor(workers, "kvmem-index") if workers > 0 else None
        self._pending: deque[tuple[list[int], Future[np.ndarray]]] = deque()
        self._store_lock = threading.Lock()  # pending summaries are stored in order
        self.wait_ms = 0.0  # time readers spent waiting for summaries

    def add_blocks(self, blocks: Sequence[BlockKeys]) -> None:
        if self._pool is None:
            super().add_blocks(blocks)
            return
        batch = list(blocks)
        step = -(-len(batch) // self.workers) if batch else 1
        for i in range(0, len(batch), step):
            part = batch[i : i + step]
            future = self._pool.submit(self.summarize, part)
            self._pending.append(([b.block_id for b in part], future))

    def flush(self) -> None:
        """Wait for every pending summary and store it."""
        self._store_until(lambda: bool(self._pending))

    def _sync(self) -> None:
        self.flush()

    def _sync_blocks(self, block_ids: Sequence[int]) -> None:
        """Store pending summaries, in order, until none of `block_ids` is pending."""
        wanted = set(block_ids)
        self._store_until(lambda: any(not wanted.isdisjoint(ids) for ids, _ in list(self._pending)))

    def _store_until(self, more: Callable[[], bool]) -> None:
        t0 = time.perf_counter()
        with self._store_lock:
            while self._pending and more():
                ids, future = self._pending.popleft()
                self.put(ids, future.result())
        self.wait_ms += (time.perf_counter() - t0) * 1e3

    def close(self) -> None:
        if self._pool is not None:
            self._pending.clear()
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
