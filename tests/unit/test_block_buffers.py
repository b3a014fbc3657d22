"""BlockBuffers: buffers of the block size, pages touched by a worker ahead of use."""

from __future__ import annotations

import time

import numpy as np

from kvmem.engine.transfer.block_buffers import BlockBuffers


def _wait_ready(pool: BlockBuffers, n_bytes: int) -> None:
    deadline = time.monotonic() + 10
    while pool.ready_bytes < n_bytes and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pool.ready_bytes >= n_bytes


def test_first_take_is_fresh_then_prepared_buffers_are_served():
    pool = BlockBuffers(ahead_bytes=4 * 1000)
    try:
        first = pool.take(1000)
        assert first.shape == (1000,) and first.dtype == np.uint8
        assert (pool.hits, pool.misses) == (0, 1)
        _wait_ready(pool, 4 * 1000)  # the worker keeps exactly ahead_bytes // size ready
        assert pool.ready_bytes == 4000
        got = [pool.take(1000) for _ in range(4)]
        assert (pool.hits, pool.misses) == (4, 1)
        assert all(b.shape == (1000,) and not np.shares_memory(b, first) for b in got)
        assert len({b.ctypes.data for b in got}) == 4  # four distinct buffers
    finally:
        pool.close()


def test_a_new_size_drops_the_prepared_buffers():
    pool = BlockBuffers(ahead_bytes=3 * 512)
    try:
        pool.take(512)
        _wait_ready(pool, 3 * 512)
        other = pool.take(256)
        assert other.shape == (256,)
        assert pool.misses == 2  # the 512-byte buffers do not serve a 256-byte take
        _wait_ready(pool, 6 * 256)
        assert pool.take(256).shape == (256,) and pool.hits == 1
    finally:
        pool.close()


def test_no_worker_without_room_and_close_stops_it():
    pool = BlockBuffers(ahead_bytes=0)
    assert pool.take(64).shape == (64,)
    time.sleep(0.05)
    assert pool.ready_bytes == 0 and pool.misses == 1
    pool.close()
    big = BlockBuffers(ahead_bytes=100)
    big.take(200)  # a block larger than the bound: nothing is prepared
    time.sleep(0.05)
    assert big.ready_bytes == 0
    big.close()
