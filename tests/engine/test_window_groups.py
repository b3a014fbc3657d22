"""Evictions outside the planner (ring spill, room for a replay) keep an image's blocks
together: GpuWindow._whole_groups against exact block lists."""

from __future__ import annotations

from types import SimpleNamespace

from kvmem.engine.window import GpuWindow
from kvmem.memory.spans import TokenSpan


class _Table:
    block_tokens = 128
    n_complete_blocks = 10

    def __init__(self, on_gpu: set[int]) -> None:
        self._on_gpu = on_gpu

    def is_on_gpu(self, b: int) -> bool:
        return b in self._on_gpu


def _take(order, n, groups, on_gpu=frozenset(range(10)), taken=()):
    fake = SimpleNamespace(table=_Table(set(on_gpu)), _groups=tuple(groups))
    return GpuWindow._whole_groups(fake, order, n, set(taken))


def test_without_groups_the_first_n_blocks():
    assert _take([3, 4, 5, 6], 2, []) == [3, 4]


def test_a_group_is_taken_whole():
    image = TokenSpan(4 * 128 + 10, 6 * 128 + 20)  # blocks 4, 5, 6
    assert _take([3, 4, 5, 7], 2, [image]) == [3, 7]  # block 6 is not in the order
    assert _take([4, 5, 6, 7], 1, [image]) == [4, 5, 6]
    assert _take([5, 6, 4, 7], 2, [image]) == [4, 5, 6]


def test_a_group_with_a_member_outside_the_order_is_skipped():
    image = TokenSpan(4 * 128, 6 * 128)  # blocks 4, 5
    assert _take([4, 7, 8], 1, [image]) == [7]  # block 5 is not evictable here
    assert _take([4, 5, 7], 1, [image], taken={5}) == [7]


def test_members_not_on_the_gpu_are_not_evicted_again():
    image = TokenSpan(4 * 128, 7 * 128)  # blocks 4, 5, 6; 5 already on the host
    assert _take([4, 6, 8], 1, [image], on_gpu={4, 6, 8}) == [4, 6]
