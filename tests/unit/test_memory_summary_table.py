"""SummaryTable: the score-ready layout against a plain dict of per-block summaries."""

from __future__ import annotations

import numpy as np
import pytest

from kvmem.errors import MemoryLayoutError
from kvmem.memory.summary_table import N_STATS, STAT_MAX, STAT_MEAN, STAT_MIN, SummaryTable

N_SCORED, N_KV, HEAD_DIM = 2, 3, 4


def _stats(rng: np.random.Generator, n: int) -> np.ndarray:
    """float32 [n, N_STATS, N_SCORED, N_KV, HEAD_DIM]."""
    return rng.standard_normal((n, N_STATS, N_SCORED, N_KV, HEAD_DIM)).astype(np.float32)


def _check_layout(table: SummaryTable, expected: dict[int, np.ndarray]) -> None:
    """Every block's row of mean_keys / bound_keys holds its summaries, element by element."""
    assert len(table) == len(expected)
    assert table.block_ids() == tuple(sorted(expected))
    mean, bound = table.mean_keys, table.bound_keys
    assert mean.shape == (N_SCORED, N_KV, len(expected), HEAD_DIM)
    assert bound.shape == (N_SCORED, N_KV, len(expected), 2 * HEAD_DIM)
    ids = sorted(expected)
    rows = table.rows(ids).tolist()
    assert sorted(rows) == list(range(len(expected)))  # dense rows [0, len)
    for block_id, row in zip(ids, rows, strict=True):
        s = expected[block_id]  # [N_STATS, N_SCORED, N_KV, HEAD_DIM]
        for j in range(N_SCORED):
            for h in range(N_KV):
                for d in range(HEAD_DIM):
                    assert mean[j, h, row, d] == s[STAT_MEAN, j, h, d]
                    assert bound[j, h, row, d] == s[STAT_MAX, j, h, d]
                    assert bound[j, h, row, HEAD_DIM + d] == s[STAT_MIN, j, h, d]
    got = table.stats(ids)  # [n, N_STATS, N_SCORED, N_KV, HEAD_DIM]
    assert np.array_equal(got, np.stack([expected[b] for b in ids]))


def test_put_remove_and_growth_keep_every_row() -> None:
    rng = np.random.default_rng(1)
    table = SummaryTable(N_SCORED, N_KV, HEAD_DIM)
    expected: dict[int, np.ndarray] = {}
    first = _stats(rng, 50)
    table.put(list(range(50)), first)
    expected.update(zip(range(50), first, strict=True))
    table.remove([3, 49, 17, 1000])  # 1000 is not held: ignored
    for b in (3, 49, 17):
        del expected[b]
    _check_layout(table, expected)
    more = _stats(rng, 100)  # past the initial capacity of 64, twice
    table.put(list(range(100, 200)), more)
    expected.update(zip(range(100, 200), more, strict=True))
    _check_layout(table, expected)
    assert table.nbytes == 4 * 256 * N_SCORED * N_KV * 3 * HEAD_DIM  # capacity 64 -> 256
    replaced = _stats(rng, 2)
    table.put([5, 150], replaced)  # new summaries of held blocks replace the old ones
    expected[5], expected[150] = replaced
    table.remove(range(100, 140))
    for b in range(100, 140):
        del expected[b]
    _check_layout(table, expected)


def test_a_repeated_id_keeps_its_last_summary() -> None:
    rng = np.random.default_rng(2)
    table = SummaryTable(N_SCORED, N_KV, HEAD_DIM)
    stats = _stats(rng, 3)
    table.put([7, 8, 7], stats)
    _check_layout(table, {7: stats[2], 8: stats[1]})


def test_stats_is_a_copy_and_the_keys_are_views() -> None:
    rng = np.random.default_rng(3)
    table = SummaryTable(N_SCORED, N_KV, HEAD_DIM)
    stats = _stats(rng, 2)
    table.put([0, 1], stats)
    got = table.stats([1])
    got[:] = 0.0
    assert np.array_equal(table.stats([1])[0], stats[1])
    assert not table.mean_keys.flags.owndata


def test_bad_shapes_and_unknown_ids_are_rejected() -> None:
    table = SummaryTable(N_SCORED, N_KV, HEAD_DIM)
    with pytest.raises(MemoryLayoutError):
        table.put([0], np.zeros((1, N_STATS, N_SCORED, N_KV, HEAD_DIM + 1), np.float32))
    with pytest.raises(MemoryLayoutError):
        table.put([0, 1], np.zeros((1, N_STATS, N_SCORED, N_KV, HEAD_DIM), np.float32))
    with pytest.raises(MemoryLayoutError, match="block 4"):
        table.rows([4])
    table.put([], np.zeros((0, N_STATS, N_SCORED, N_KV, HEAD_DIM), np.float32))
    assert len(table) == 0
