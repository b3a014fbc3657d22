"""BlockTable: history, completed blocks, truncation and residency."""

from __future__ import annotations

import numpy as np
import pytest

from kvmem.errors import MemoryLayoutError
from kvmem.memory.block_table import BlockInfo, BlockTable, TruncateResult


def _table(n_tokens: int, block_tokens: int = 4) -> BlockTable:
    table = BlockTable(block_tokens)
    table.append(list(range(100, 100 + n_tokens)))
    return table


def test_append_reports_completed_blocks() -> None:
    table = BlockTable(4)
    assert table.append([1, 2, 3]) == ()
    assert table.append([4, 5, 6, 7, 8, 9]) == (0, 1)
    assert table.append([]) == ()
    assert table.append([10, 11, 12]) == (2,)
    assert table.n_tokens == 12
    assert table.n_complete_blocks == 3
    assert table.n_blocks == 3
    assert table.tokens == list(range(1, 13))
    assert table.complete_blocks() == range(3)


def test_append_grows_past_initial_capacity() -> None:
    table = BlockTable(128)
    completed = table.append(list(range(3000)))
    assert completed == tuple(range(23))
    assert table.append(list(range(3000, 5000))) == tuple(range(23, 39))
    assert table.tokens == list(range(5000))
    tokens_copy = table.tokens
    tokens_copy.append(-1)
    assert table.n_tokens == 5000


def test_info_of_complete_and_partial_blocks() -> None:
    table = _table(10)
    table.mark_on_gpu([0, 2])
    table.mark_in_host([1])
    assert table.info(0) == BlockInfo(block_id=0, start=0, end=4, on_gpu=True, in_host=False)
    assert table.info(1) == BlockInfo(block_id=1, start=4, end=8, on_gpu=False, in_host=True)
    assert table.info(2) == BlockInfo(block_id=2, start=8, end=10, on_gpu=True, in_host=False)
    assert table.info(2).n_tokens == 2
    with pytest.raises(MemoryLayoutError):
        table.info(3)
    with pytest.raises(MemoryLayoutError):
        table.info(-1)


def test_residency_sets() -> None:
    table = _table(17)
    table.mark_on_gpu([3, 0, 4])
    table.mark_in_host([2, 0, 1])
    assert table.gpu_blocks() == (0, 3, 4)
    assert table.host_blocks() == (0, 1, 2)
    table.mark_off_gpu([3, 9])
    table.mark_not_in_host([0])
    assert table.gpu_blocks() == (0, 4)
    assert table.host_blocks() == (1, 2)
    assert table.is_on_gpu(4) and not table.is_on_gpu(3)
    assert table.is_in_host(1) and not table.is_in_host(0)


def test_open_tail_block_is_never_in_host() -> None:
    table = _table(10)
    with pytest.raises(MemoryLayoutError):
        table.mark_in_host([2])
    with pytest.raises(MemoryLayoutError):
        table.mark_on_gpu([3])
    assert table.host_blocks() == ()
    assert table.gpu_blocks() == ()


def test_truncate_inside_a_block() -> None:
    table = _table(18)  # blocks 0..3 complete, 4 partial (2 tokens)
    table.mark_in_host([0, 1, 2, 3])
    table.mark_on_gpu([0, 1, 2, 3, 4])
    result = table.truncate(9)
    assert result == TruncateResult(n_tokens=9, dropped_blocks=(2, 3, 4), reopened_block=2)
    assert table.tokens == list(range(100, 109))
    assert table.host_blocks() == (0, 1)
    assert table.gpu_blocks() == (0, 1, 2)  # the reopened block keeps its GPU flag
    assert table.n_complete_blocks == 2


def test_truncate_on_a_block_boundary() -> None:
    table = _table(16)
    table.mark_in_host([0, 1, 2, 3])
    table.mark_on_gpu([1, 2, 3])
    result = table.truncate(8)
    assert result == TruncateResult(n_tokens=8, dropped_blocks=(2, 3), reopened_block=None)
    assert table.host_blocks() == (0, 1)
    assert table.gpu_blocks() == (1,)


def test_truncate_to_zero_and_noop() -> None:
    table = _table(6)
    table.mark_in_host([0])
    table.mark_on_gpu([0, 1])
    assert table.truncate(6) == TruncateResult(n_tokens=6, dropped_blocks=(), reopened_block=None)
    assert table.host_blocks() == (0,)
    assert table.truncate(0) == TruncateResult(
        n_tokens=0, dropped_blocks=(0, 1), reopened_block=None
    )
    assert table.tokens == []
    assert table.host_blocks() == ()
    assert table.gpu_blocks() == ()
    with pytest.raises(MemoryLayoutError):
        table.truncate(1)


def test_append_after_truncate_recompletes_blocks() -> None:
    table = _table(12)
    table.truncate(5)
    assert table.append([7, 7, 7]) == (1,)
    assert table.tokens == [100, 101, 102, 103, 104, 7, 7, 7]


def _prefix_loop(a: list[int], b: list[int]) -> int:
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


def test_common_prefix_by_hand() -> None:
    table = BlockTable(4)
    table.append([5, 6, 7, 8, 9])
    assert table.common_prefix([5, 6, 7, 8, 9, 10, 11]) == 5
    assert table.common_prefix([5, 6, 0, 8, 9]) == 2
    assert table.common_prefix([5, 6]) == 2
    assert table.common_prefix([]) == 0
    assert table.common_prefix([1]) == 0
    assert BlockTable(4).common_prefix([1, 2]) == 0


def test_common_prefix_matches_loop() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        history = rng.integers(0, 3, size=int(rng.integers(0, 40))).tolist()
        other = history[: int(rng.integers(0, len(history) + 1))]
        other = other + rng.integers(0, 3, size=int(rng.integers(0, 10))).tolist()
        table = BlockTable(8)
        table.append(history)
        assert table.common_prefix(other) == _prefix_loop(history, other)


def test_token_array_is_read_only_view() -> None:
    table = _table(5)
    arr = table.token_array()
    assert arr.tolist() == [100, 101, 102, 103, 104]
    with pytest.raises(ValueError):
        arr[0] = 1


def test_invalid_block_tokens() -> None:
    with pytest.raises(MemoryLayoutError):
        BlockTable(0)
