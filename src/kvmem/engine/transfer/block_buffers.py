"""Host buffers for harvested blocks, with their pages touched ahead of use.

A harvested block is copied out of the staging buffer into a buffer of its own. Fresh
memory costs a page fault per 4 KiB page on first touch, and on the H200 host that made
the copy-out run at ~1 GB/s: 20 of the 69 seconds of a 256K prefill. Every complete block
of one layout has the same size, so a worker thread allocates buffers of that size ahead
of use and touches their pages while the GPU computes the next prefill chunk; the copy-out
then writes memory that is already mapped. A buffer is an ordinary numpy array: when its
block leaves the host store it is freed like any other.

The worker keeps at most `ahead_bytes` ready (the memory it holds beyond the store). The
content of a block never depends on the pool: a buffer is overwritten whole by its block.
`take` hands out a fresh (untouched) buffer when none is ready. Every session of the
process (lanes, warm conversations) takes from one pool (`shared_buffers`), so the memory
held ahead does not grow with their number.
"""

from __future__ import annotations

import logging
import threading
from collections import deque

import numpy as np

logger = logging.getLogger(__name__)

AHEAD_BYTES = 256 << 20  # touched-ahead memory kept ready (one pool per process)


class BlockBuffers:
    def __init__(self, ahead_bytes: int = AHEAD_BYTES) -> None:
        self.ahead_bytes = ahead_bytes
        self._ready: deque[np.ndarray] = deque()  # uint8 [size] each
        self._size = 0  # the block size the worker prepares; 0 until the first take
        self._cond = threading.Condition()
        self._closed = False
        self._worker: threading.Thread | None = None
        self.hits = 0  # takes served by a prepared buffer
        self.misses = 0  # takes that got fresh memory

    def take(self, n_bytes: int) -> np.ndarray:
        """uint8 [n_bytes]: a prepared buffer of that size when one is ready, else fresh."""
        with self._cond:
            if n_bytes != self._size:
                self._size = n_bytes
                self._ready.clear()
            buf = self._ready.popleft() if self._ready else None
            self._start()
            self._cond.notify()
        if buf is None:
            self.misses += 1
            return np.empty(n_bytes, dtype=np.uint8)  # [n_bytes]
        self.hits += 1
        return buf

    @property
    def ready_bytes(self) -> int:
        with self._cond:
            return len(self._ready) * self._size

    def _start(self) -> None:
        if self._worker is None and self.ahead_bytes > 0 and not self._closed:
            self._worker = threading.Thread(target=self._run, name="kvmem-prefault", daemon=True)
            self._worker.start()

    def _wanted(self) -> bool:
        """One more buffer fits the ahead bound (call with the lock held)."""
        return self._size > 0 and (len(self._ready) + 1) * self._size <= self.ahead_bytes

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._wanted():
                    self._cond.wait()
                if self._closed:
                    return
                size = self._size
            buf = np.empty(size, dtype=np.uint8)  # [size]
            buf.fill(0)  # touch every page now, off the copy-out's path
            with self._cond:
                if size == self._size and not self._closed:
                    self._ready.append(buf)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._ready.clear()
            self._cond.notify_all()
        if self._worker is not None:
            self._worker.join(timeout=5)
            self._worker = None


_SHARED: BlockBuffers | None = None
_SHARED_LOCK = threading.Lock()


def take_buffer(buffers: BlockBuffers | None, n_bytes: int) -> np.ndarray:
    """uint8 [n_bytes] for a harvested block: from `buffers` (pages touched ahead) when
    there is a pool, else fresh memory."""
    if buffers is not None:
        return buffers.take(n_bytes)
    return np.empty(n_bytes, dtype=np.uint8)  # [n_bytes]


def shared_buffers() -> BlockBuffers:
    """The process's pool (created on first use; its worker is a daemon thread)."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None:
            _SHARED = BlockBuffers()
        return _SHARED
