"""TieredStore, the block file format and the session manifest: exact bytes, real files."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from kvmem.errors import ConfigError, KVTransferError, StoreCorruptError
from kvmem.memory.block_file import block_digest, decode_block, encoded_size
from kvmem.memory.host_store import BlockKV, BlockStore
from kvmem.memory.session_manifest import (
    SessionManifest,
    read_manifest,
    read_summary,
    write_manifest,
    write_summary,
)
from kvmem.memory.tiered_store import TieredStore, read_block_file


def _block(block_id: int, seed: int = 0, n_tokens: int = 4) -> BlockKV:
    rng = np.random.default_rng(1000 * seed + block_id)
    start = block_id * n_tokens
    return BlockKV(
        block_id=block_id,
        positions=np.arange(start, start + n_tokens, dtype=np.int32),  # [n_tokens]
        k=[rng.integers(0, 256, (n_tokens, 34), dtype=np.uint8) for _ in range(2)],
        v=[rng.integers(0, 256, (n_tokens, 16), dtype=np.uint8) for _ in range(2)],
    )


def _same(a: BlockKV, b: BlockKV) -> bool:
    return (
        a.block_id == b.block_id
        and np.array_equal(a.positions, b.positions)
        and all(np.array_equal(x, y) for x, y in zip(a.k + a.v, b.k + b.v, strict=True))
    )


BLOCK_BYTES = 416  # 4 positions x 4 + 2 layers x 4 x (34 + 16)
FILE_BYTES = 24 + 2 * 8 + BLOCK_BYTES + 16  # header, per-layer widths, body, digest


@pytest.fixture
def store(tmp_path: Path):
    s = TieredStore(tmp_path, ram_cap_bytes=2 * BLOCK_BYTES)
    yield s
    s.close()


def test_block_file_round_trip_and_damage(tmp_path: Path) -> None:
    block = _block(3)
    assert block.nbytes == BLOCK_BYTES and encoded_size(block) == FILE_BYTES == 472
    s = TieredStore(tmp_path)
    s.put(block)
    assert s.flush(10)
    s.close()
    data = (tmp_path / "blocks" / "b00000003.kvb").read_bytes()
    assert len(data) == 472
    back, digest = decode_block(data, 3)
    assert _same(back, block) and digest == block_digest(block) == data[-16:]
    flipped = bytearray(data)
    flipped[100] ^= 1
    with pytest.raises(StoreCorruptError, match="checksum mismatch"):
        decode_block(bytes(flipped))
    with pytest.raises(StoreCorruptError, match="checksum mismatch"):
        decode_block(data[:-5])  # a torn write
    with pytest.raises(StoreCorruptError, match="holds block 3, expected 4"):
        decode_block(data, 4)


def test_lru_spill_and_read_through(store: TieredStore, tmp_path: Path) -> None:
    assert isinstance(store, BlockStore)
    blocks = [_block(b) for b in range(4)]
    for block in blocks:
        store.put(block)
    assert store.flush(10)
    assert store.block_ids() == (0, 1, 2, 3) and len(store) == 4
    assert store.nbytes == 4 * BLOCK_BYTES
    assert (store.ram_blocks, store.ram_bytes) == (2, 2 * BLOCK_BYTES)  # blocks 2 and 3
    assert (store.disk_blocks, store.disk_bytes) == (4, 4 * FILE_BYTES)
    assert store.tier.disk_blocks_written == 4 and store.tier.disk_write_bytes == 4 * FILE_BYTES
    assert store.tier.ram_evictions == 2
    assert _same(store.get(3), blocks[3])  # RAM
    assert _same(store.get(0), blocks[0])  # disk -> RAM, evicts the LRU block (2)
    assert (store.tier.ram_hits, store.tier.ram_misses) == (1, 1)
    assert store.tier.disk_read_bytes == FILE_BYTES
    assert _same(store.get(3), blocks[3]) and store.tier.ram_hits == 2
    assert _same(store.get(2), blocks[2]) and store.tier.ram_misses == 2
    assert sorted(p.name for p in (tmp_path / "blocks").iterdir()) == [
        f"b0000000{b}.kvb" for b in range(4)
    ]


def test_drop_and_replace_update_the_files(store: TieredStore, tmp_path: Path) -> None:
    for b in range(3):
        store.put(_block(b))
    store.put(_block(1, seed=7))  # a replay harvests block 1 again
    assert store.flush(10)
    assert _same(read_block_file(tmp_path, 1)[0], _block(1, seed=7))
    assert store.drop([0, 5]) == BLOCK_BYTES
    assert store.flush(10)
    assert not (tmp_path / "blocks" / "b00000000.kvb").exists()
    assert store.block_ids() == (1, 2) and store.disk_blocks == 2
    with pytest.raises(KVTransferError, match="block 0 is not in the block store"):
        store.get(0)


def test_enospc_degrades_to_ram_only(tmp_path: Path, caplog) -> None:
    """Every block file write hits a real ENOSPC (/dev/full): nothing leaves RAM."""
    dev_full = Path("/dev/full")
    if not dev_full.exists():
        pytest.skip("/dev/full is not available")
    s = TieredStore(tmp_path, ram_cap_bytes=BLOCK_BYTES, opener=lambda _p: dev_full.open("wb"))
    blocks = [_block(b) for b in range(3)]
    with caplog.at_level(logging.WARNING, logger="kvmem.memory.tiered_store"):
        for block in blocks:
            s.put(block)
        assert s.flush(10)
    assert s.degraded == "No space left on device writing block 0"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "continuing RAM-only (no block is lost" in warnings[0]
    assert (s.ram_blocks, s.disk_blocks, s.tier.write_failures) == (3, 0, 1)
    assert all(_same(s.get(b.block_id), b) for b in blocks)
    assert s.tier.ram_misses == 0
    assert list((tmp_path / "blocks").iterdir()) == []  # no temporary file left behind
    s.close()


def test_disk_cap_keeps_new_blocks_in_ram(tmp_path: Path) -> None:
    s = TieredStore(tmp_path, ram_cap_bytes=BLOCK_BYTES, disk_cap_bytes=2 * FILE_BYTES)
    blocks = [_block(b) for b in range(4)]
    for block in blocks:
        s.put(block)
    assert s.flush(10)
    assert (s.disk_blocks, s.ram_blocks) == (2, 2)  # blocks 2 and 3 have only RAM copies
    assert s.is_durable(1) and not s.is_durable(2)
    assert all(_same(s.get(b.block_id), b) for b in blocks)
    s.close()


def test_one_process_per_directory(store: TieredStore, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is in use by another kvmem process"):
        TieredStore(tmp_path)


def test_manifest_round_trip_and_torn_write(tmp_path: Path) -> None:
    tokens = np.arange(8, dtype=np.int32) * 3  # [8]
    m = SessionManifest({"model": "x", "ctk": "f16"}, 4, tokens, [b"a" * 16, b"b" * 16], {"v": 1})
    write_manifest(tmp_path, m)
    back = read_manifest(tmp_path)
    assert back is not None
    assert back.fingerprint == {"model": "x", "ctk": "f16"} and back.layout == {"v": 1}
    assert back.block_tokens == 4 and back.tokens.tolist() == [0, 3, 6, 9, 12, 15, 18, 21]
    assert back.digests == [b"a" * 16, b"b" * 16]
    path = tmp_path / "session.kvm"
    path.write_bytes(path.read_bytes()[:-9])
    with pytest.raises(StoreCorruptError, match="checksum mismatch"):
        read_manifest(tmp_path)
    assert read_manifest(tmp_path / "nowhere") is None


def test_summary_is_tied_to_the_block_version(tmp_path: Path) -> None:
    (tmp_path / "blocks").mkdir()
    summary = np.arange(24, dtype=np.float32).reshape(3, 2, 4)  # [3, 2, 4]
    write_summary(tmp_path, 5, b"d" * 16, summary)
    assert np.array_equal(read_summary(tmp_path, 5, b"d" * 16), summary)
    assert read_summary(tmp_path, 5, b"e" * 16) is None  # another version of block 5
    assert read_summary(tmp_path, 6, b"d" * 16) is None


def test_a_killed_writers_temporary_files_are_removed(tmp_path: Path) -> None:
    (tmp_path / "blocks").mkdir()
    half = tmp_path / "blocks" / ".b00000001.kvb.4242.tmp"
    half.write_bytes(b"KVMB" + bytes(10))
    manifest_tmp = tmp_path / ".session.kvm.4242.tmp"
    manifest_tmp.write_bytes(b"KVMS")
    s = TieredStore(tmp_path)
    assert not half.exists() and not manifest_tmp.exists()
    assert s.block_ids() == () and s.disk_blocks == 0
    s.close()
