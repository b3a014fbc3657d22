"""The staging buffer grows in 64 MiB steps and counts what its growths cost (the
profile's staging_grow: page-locking a GiB on the GPU host is not free)."""

from __future__ import annotations

from kvmem.engine.host_staging import StagingBuffer


def test_growth_is_counted_once_per_reallocation():
    staging = StagingBuffer(None, limit_bytes=1 << 30)
    assert (staging.capacity, staging.grown_bytes, staging.grow_ms) == (0, 0, 0.0)
    view = staging.view(1000)
    assert view.shape == (1000,) and staging.capacity == 64 << 20
    assert staging.grown_bytes == 64 << 20 and staging.grow_ms > 0
    ms = staging.grow_ms
    staging.view(64 << 20)  # fits: no growth
    assert (staging.grown_bytes, staging.grow_ms) == (64 << 20, ms)
    staging.view((64 << 20) + 1)  # one more granule: a new buffer of 128 MiB
    assert staging.capacity == staging.grown_bytes - (64 << 20) == 128 << 20
    assert not staging.pinned
    staging.close()
    assert staging.capacity == 0
