"""HostStore: exact byte accounting, replacement, drops, ownership and errors."""

from __future__ import annotations

import numpy as np
import pytest

from kvmem.errors import KVTransferError, MemoryLayoutError
from kvmem.memory.host_store import BlockKV, BlockStore, HostStore, HostStoreStats


def _block(
    block_id: int, n_tokens: int = 4, n_layers: int = 2, k_row: int = 34, v_row: int = 16
) -> BlockKV:
    start = block_id * n_tokens
    rng = np.random.default_rng(block_id)
    return BlockKV(
        block_id=block_id,
        positions=np.arange(start, start + n_tokens, dtype=np.int32),  # [n_tokens]
        k=[rng.integers(0, 256, (n_tokens, k_row), dtype=np.uint8) for _ in range(n_layers)],
        v=[rng.integers(0, 256, (n_tokens, v_row), dtype=np.uint8) for _ in range(n_layers)],
    )


def test_block_nbytes() -> None:
    block = _block(0, n_tokens=4, n_layers=2, k_row=34, v_row=16)
    assert block.nbytes == 4 * 4 + 2 * 4 * 34 + 2 * 4 * 16  # 416
    assert block.n_tokens == 4


def test_put_get_drop_accounting() -> None:
    store = HostStore()
    assert isinstance(store, BlockStore)
    a, b, c = _block(0), _block(1), _block(2, n_tokens=2)
    for block in (a, b, c):
        store.put(block)
    assert store.nbytes == 416 + 416 + 208
    assert len(store) == 3
    assert store.block_ids() == (0, 1, 2)
    assert 1 in store and 5 not in store

    got = store.get(1)
    assert got.block_id == 1
    np.testing.assert_array_equal(got.positions, [4, 5, 6, 7])
    np.testing.assert_array_equal(got.k[1], b.k[1])
    np.testing.assert_array_equal(got.v[0], b.v[0])

    assert store.drop([0, 7, 2]) == 416 + 208
    assert store.nbytes == 416
    assert store.block_ids() == (1,)
    assert store.drop([0]) == 0
    # get() is not a restore: bytes_out is left to the restoring caller
    assert store.stats == HostStoreStats(
        blocks_stored=3, blocks_dropped=2, bytes_in=1040, bytes_out=0, peak_bytes=1040
    )
    store.stats.bytes_out += 416
    assert store.stats.bytes_out == 416


def test_put_replaces_and_fixes_byte_count() -> None:
    store = HostStore()
    store.put(_block(3, n_tokens=4))
    store.put(_block(3, n_tokens=2))
    assert len(store) == 1
    assert store.nbytes == 208
    assert store.get(3).n_tokens == 2
    assert store.stats.blocks_stored == 2
    assert store.stats.bytes_in == 416 + 208
    assert store.stats.peak_bytes == 416


def test_missing_block_raises_transfer_error() -> None:
    store = HostStore()
    with pytest.raises(KVTransferError):
        store.get(0)


def test_views_into_a_large_buffer_are_copied() -> None:
    blob = np.arange(10_000, dtype=np.uint32).view(np.uint8)  # [40000] one large buffer
    k = blob[:136].reshape(4, 34)  # [n_tokens, k_row] view into blob
    v = np.frombuffer(blob.tobytes(), dtype=np.uint8)[:64].reshape(4, 16)  # view into bytes
    positions = np.arange(4, dtype=np.int32)  # [n_tokens]
    store = HostStore()
    store.put(BlockKV(block_id=0, positions=positions, k=[k], v=[v]))
    stored = store.get(0)
    assert not np.shares_memory(stored.k[0], blob)
    np.testing.assert_array_equal(stored.k[0], k)
    np.testing.assert_array_equal(stored.v[0], v)
    assert store.nbytes == 16 + 136 + 64


def test_owned_arrays_are_kept_and_made_read_only() -> None:
    block = _block(0)
    store = HostStore()
    store.put(block)
    stored = store.get(0)
    assert stored.k[0] is block.k[0]
    with pytest.raises(ValueError):
        stored.k[0][0, 0] = 1
    with pytest.raises(ValueError):
        stored.positions[0] = 1


@pytest.mark.parametrize(
    "bad",
    [
        BlockKV(block_id=0, positions=np.arange(4, dtype=np.int64), k=[], v=[]),
        BlockKV(block_id=0, positions=np.array([0, 2, 1, 3], dtype=np.int32), k=[], v=[]),
        BlockKV(
            block_id=0,
            positions=np.arange(4, dtype=np.int32),
            k=[np.zeros((4, 34), np.uint8)],
            v=[],
        ),
        BlockKV(
            block_id=0,
            positions=np.arange(4, dtype=np.int32),
            k=[np.zeros((3, 34), np.uint8)],
            v=[np.zeros((4, 16), np.uint8)],
        ),
        BlockKV(
            block_id=0,
            positions=np.arange(4, dtype=np.int32),
            k=[np.zeros((4, 34), np.float32)],
            v=[np.zeros((4, 16), np.uint8)],
        ),
    ],
)
def test_malformed_blocks_are_rejected(bad: BlockKV) -> None:
    store = HostStore()
    with pytest.raises(MemoryLayoutError):
        store.put(bad)
    assert len(store) == 0
    assert store.nbytes == 0


def test_cell_extensions_are_stored_and_checked() -> None:
    store = HostStore()
    block = _block(0)
    block.ext = np.arange(12, dtype=np.int32).reshape(4, 3)  # [n_tokens, (x, y, tok)]
    store.put(block)
    assert store.nbytes == 416 + 48
    got = store.get(0)
    assert got.ext is not None and got.ext.tolist() == block.ext.tolist()
    assert not got.ext.flags.writeable  # kept read-only, like K and V
    bad = _block(1)
    bad.ext = np.zeros((4, 2), dtype=np.int32)
    with pytest.raises(MemoryLayoutError, match=r"cell extensions must be int32 \[4, 3\]"):
        store.put(bad)
