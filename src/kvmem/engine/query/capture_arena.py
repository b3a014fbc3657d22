"""Where the query capture reads Qcur rows to: a page-locked arena, filled in order."""

from __future__ import annotations

import numpy as np

from ..llama.host_staging import StagingBuffer

ARENA_MAX = 2 << 30  # page-locked bytes the capture keeps at most (2 GiB)


class CaptureArena:
    """Page-locked memory the query rows of one armed pass are read into, one after
    another. On a GPU a copy into pageable memory runs at ~1.5 GB/s (0.48 s of a 32K
    prefill on the H200 in session 5); into this buffer it runs at bus speed. A read
    that does not fit goes to fresh memory, and the next pass reserves what this one
    needed. Views handed out are valid until the next `start`."""

    def __init__(self, staging: StagingBuffer) -> None:
        self._staging = staging
        self._used = 0
        self._needed = 0  # bytes the current pass asked for, fitting or not

    def start(self, expected_bytes: int = 0) -> None:
        want = min(max(expected_bytes, self._needed), ARENA_MAX)
        if want > self._staging.capacity:
            self._staging.view(want)  # grows (at least doubling) before the pass, not in it
        self._used = self._needed = 0

    @property
    def used(self) -> int:
        """Bytes of the current pass read into the arena."""
        return self._used

    def take(self, n_bytes: int) -> np.ndarray | None:
        """uint8 [n_bytes] of the buffer, or None when the pass has outgrown it."""
        self._needed += n_bytes
        if self._used + n_bytes > self._staging.capacity:
            return None
        out = self._staging.view(self._used + n_bytes)[self._used :]
        self._used += n_bytes
        return out
