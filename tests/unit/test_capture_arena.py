"""The query capture's arena: reads are laid one after another, a read that does not fit
is refused (the caller reads into fresh memory), and the next pass reserves what the last
one needed, before it starts."""

from __future__ import annotations

import numpy as np

from kvmem.engine.llama.host_staging import StagingBuffer
from kvmem.engine.query.capture_arena import ARENA_MAX, CaptureArena

MIB = 1 << 20


def test_reads_are_laid_in_order_until_the_arena_is_full():
    staging = StagingBuffer(None, limit_bytes=1 << 30)
    arena = CaptureArena(staging)
    arena.start(100)  # rounded up to the staging granule: 64 MiB
    assert staging.capacity == 64 * MIB
    first, second = arena.take(40 * MIB), arena.take(20 * MIB)
    assert first is not None and second is not None
    base = staging.view(1).ctypes.data
    assert (first.ctypes.data - base, second.ctypes.data - base) == (0, 40 * MIB)
    assert (first.nbytes, second.nbytes) == (40 * MIB, 20 * MIB)
    first[:] = 1
    second[:] = 2
    assert arena.take(8 * MIB) is None  # 68 MiB > 64: fresh memory for this one
    assert arena.take(4 * MIB) is not None  # a smaller one still fits after it
    assert staging.capacity == 64 * MIB  # never grown inside a pass
    assert first[-1] == 1 and second[0] == 2  # nothing was overwritten
    arena.start()  # the last pass needed 72 MiB: reserved now, at least doubling
    assert staging.capacity == 128 * MIB
    assert arena.take(72 * MIB) is not None and arena.take(56 * MIB) is not None
    assert arena.take(1) is None
    staging.close()


def test_expected_bytes_size_the_arena_and_the_cap_holds():
    staging = StagingBuffer(None, limit_bytes=ARENA_MAX)
    arena = CaptureArena(staging)
    arena.start(200 * MIB)
    assert staging.capacity == 256 * MIB  # 200 MiB rounded up to the granule
    arena.start(ARENA_MAX * 4)  # never more than the cap is page-locked
    assert staging.capacity == ARENA_MAX
    view = arena.take(16)
    assert view is not None and view.dtype == np.uint8 and view.shape == (16,)
    staging.close()
