"""A reused host buffer for the state blobs of harvest and restore.

llama.cpp's state API copies between the KV tensors and a caller's buffer, one copy per
layer and run of cells. Into fresh pageable memory every call pays page faults and, on a
GPU, a bounce through the driver's own pinned buffer. The staging buffer is allocated
once (grown, at least doubling, when a larger blob comes), page-locked when the GPU backend offers a host
buffer type, plain memory otherwise. Whatever is read into it must be copied out before
the next use: the caller (KVTransfer) owns that rule.
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

import numpy as np

logger = logging.getLogger(__name__)

_GRANULE = 64 << 20  # grow in steps of 64 MiB


class HostAllocator(Protocol):
    """Page-locked host memory (`llama_lib.HostBufferAllocator` on a GPU build)."""

    @property
    def available(self) -> bool: ...

    def alloc(self, n_bytes: int) -> tuple[int, np.ndarray] | None: ...

    def free(self, handle: int) -> None: ...


class StagingBuffer:
    def __init__(self, allocator: HostAllocator | None, limit_bytes: int) -> None:
        self._alloc = allocator if allocator is not None and allocator.available else None
        self.limit_bytes = limit_bytes  # larger blobs are split by the caller
        self._handle: int | None = None
        self._array = np.empty(0, dtype=np.uint8)  # [capacity]
        self.pinned = False
        self.grow_ms = 0.0  # time spent (re)allocating: page-locking a GiB takes a while
        self.grown_bytes = 0  # bytes allocated by those growths

    @property
    def capacity(self) -> int:
        return len(self._array)

    def view(self, n_bytes: int) -> np.ndarray:
        """uint8 [n_bytes] at the start of the buffer (valid until the next call)."""
        if n_bytes > self.capacity:
            self._grow(n_bytes)
        return self._array[:n_bytes]

    def _grow(self, n_bytes: int) -> None:
        t0 = time.perf_counter()
        # at least double (up to the limit): page-locking runs at ~1.8 GB/s on the H200
        # host, so a restore that grows the buffer by exactly what it needs each time
        # pays that again and again
        size = max(-(-n_bytes // _GRANULE) * _GRANULE, min(self.limit_bytes, 2 * self.capacity))
        self._allocate(size)
        self.grow_ms += (time.perf_counter() - t0) * 1e3
        self.grown_bytes += size

    def _allocate(self, size: int) -> None:
        self.close()
        got = self._alloc.alloc(size) if self._alloc is not None else None
        if got is not None:
            self._handle, self._array = got
            self.pinned = True
        else:
            if self._alloc is not None:
                logger.warning("pinned staging buffer of %d MiB failed: pageable", size >> 20)
            self._array = np.empty(size, dtype=np.uint8)  # [size]
            self.pinned = False

    def close(self) -> None:
        if self._handle is not None and self._alloc is not None:
            self._alloc.free(self._handle)
        self._handle = None
        self._array = np.empty(0, dtype=np.uint8)  # [0]
