"""The staging buffer grows in 64 MiB steps, at least doubling, and counts what its growths cost (the
profile's staging_grow: page-locking a GiB on the GPU host is not free)."""

from __future__ import annotations

from kvmem.engine.llama.host_staging import StagingBuffer


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


def test_growth_at_least_doubles_up_to_the_limit():
    staging = StagingBuffer(None, limit_bytes=1 << 30)
    staging.view(100 << 20)
    assert staging.capacity == 128 << 20  # 100 MiB rounded up to the granule
    staging.view(130 << 20)  # 192 MiB would do: doubled to 256
    assert staging.capacity == 256 << 20
    staging.close()
    capped = StagingBuffer(None, limit_bytes=200 << 20)
    capped.view(100 << 20)
    capped.view(130 << 20)  # doubling would pass the limit: the limit
    assert capped.capacity == 200 << 20
    capped.view(250 << 20)  # a blob over the limit still fits (rounded to the granule)
    assert capped.capacity == 256 << 20
    assert capped.grown_bytes == (128 + 200 + 256) << 20
    capped.close()
