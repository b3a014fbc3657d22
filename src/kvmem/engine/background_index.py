"""A retrieval index whose block summaries are computed off the prefill's critical path.

Summarizing a harvested block (dequantize K, undo the Hadamard rotation, remove RoPE,
average) is numpy work that does not need the GPU. `BackgroundIndex.add_blocks` hands it
to a worker thread (numpy releases the GIL), so the next prefill chunk runs on the GPU
meanwhile; every read (scoring, membership, removal) first waits for the pending
summaries and applies them in submission order, so readers see exactly what a
synchronous index would hold.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from kvmem.memory.retrieval_index import BlockKeys, KeyGeometry, RetrievalIndex

logger = logging.getLogger(__name__)


class BackgroundIndex(RetrievalIndex):
    """RetrievalIndex with asynchronous `add_blocks` (workers = 0: synchronous)."""

    def __init__(self, geometry: KeyGeometry, layers: Sequence[int], workers: int = 1) -> None:
        super().__init__(geometry, layers)
        self._pool = ThreadPoolExecutor(workers, "kvmem-index") if workers > 0 else None
        self._pending: deque[tuple[list[int], Future[np.ndarray]]] = deque()
        self.wait_ms = 0.0  # time readers spent waiting for summaries

    def add_blocks(self, blocks: Sequence[BlockKeys]) -> None:
        if self._pool is None:
            super().add_blocks(blocks)
            return
        ids = [b.block_id for b in blocks]
        self._pending.append((ids, self._pool.submit(self.summarize, list(blocks))))

    def flush(self) -> None:
        """Wait for every pending summary and store it."""
        if not self._pending:
            return
        t0 = time.perf_counter()
        while self._pending:
            ids, future = self._pending.popleft()
            self.put(ids, future.result())
        self.wait_ms += (time.perf_counter() - t0) * 1e3

    def _sync(self) -> None:
        self.flush()

    def close(self) -> None:
        if self._pool is not None:
            self._pending.clear()
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
