"""The on-disk form of one block's KV: a small header, the raw rows, a checksum trailer.

Little-endian layout (version 1):

    4s  magic b"KVMB"      u16 version      u16 reserved (0)
    i64 block_id           u32 n_tokens     u32 n_layers
    n_layers x (u32 k_row_bytes, u32 v_row_bytes)
    int32 positions [n_tokens]
    per layer K rows (uint8 [n_tokens, k_row_bytes]), then per layer V rows
    16 bytes: BLAKE2b-128 of everything before it

The digest doubles as the block's version identity: the session manifest records it, so
a file replaced after the manifest was written (or half-written) is detected on load.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator

import numpy as np

from kvmem.errors import StoreCorruptError
from kvmem.memory.host_store import BlockKV

MAGIC = b"KVMB"
VERSION = 1
DIGEST_BYTES = 16
_HEAD = struct.Struct("<4sHHqII")
_LAYER = struct.Struct("<II")


def new_hasher() -> hashlib.blake2b:
    return hashlib.blake2b(digest_size=DIGEST_BYTES)


def block_parts(block: BlockKV) -> Iterator[memoryview | bytes]:
    """The file's bytes before the trailer, as a sequence of buffers (no big copy)."""
    yield _HEAD.pack(MAGIC, VERSION, 0, block.block_id, block.n_tokens, len(block.k))
    yield b"".join(
        _LAYER.pack(k.shape[1], v.shape[1]) for k, v in zip(block.k, block.v, strict=True)
    )
    yield memoryview(np.ascontiguousarray(block.positions, dtype="<i4")).cast("B")
    for a in (*block.k, *block.v):
        yield memoryview(np.ascontiguousarray(a)).cast("B")


def block_digest(block: BlockKV) -> bytes:
    """The checksum a file of `block` ends with."""
    h = new_hasher()
    for part in block_parts(block):
        h.update(part)
    return h.digest()


def encoded_size(block: BlockKV) -> int:
    """Bytes of the file for `block`, trailer included."""
    return _HEAD.size + _LAYER.size * len(block.k) + block.nbytes + DIGEST_BYTES


def decode_block(data: bytes | memoryview, expect_id: int | None = None) -> tuple[BlockKV, bytes]:
    """Parse and verify a block file; returns the block (read-only arrays) and its digest.

    Raises StoreCorruptError for a short file, a bad header or a checksum mismatch.
    """
    buf = memoryview(data)
    if len(buf) < _HEAD.size + DIGEST_BYTES:
        raise StoreCorruptError(f"block file is {len(buf)} bytes: too short")
    body, trailer = buf[:-DIGEST_BYTES], bytes(buf[-DIGEST_BYTES:])
    h = new_hasher()
    h.update(body)
    if h.digest() != trailer:
        raise StoreCorruptError("block file checksum mismatch")
    magic, version, _, block_id, n_tokens, n_layers = _HEAD.unpack_from(body, 0)
    if magic != MAGIC or version != VERSION:
        raise StoreCorruptError(f"not a version {VERSION} block file (magic {magic!r})")
    if expect_id is not None and block_id != expect_id:
        raise StoreCorruptError(f"block file holds block {block_id}, expected {expect_id}")
    off = _HEAD.size
    rows = [_LAYER.unpack_from(body, off + i * _LAYER.size) for i in range(n_layers)]
    off += n_layers * _LAYER.size
    need = off + 4 * n_tokens + n_tokens * sum(k + v for k, v in rows)
    if need != len(body):
        raise StoreCorruptError(f"block file body is {len(body)} bytes, header says {need}")
    positions = np.frombuffer(body, dtype="<i4", count=n_tokens, offset=off).astype(np.int32)
    off += 4 * n_tokens
    k: list[np.ndarray] = []
    v: list[np.ndarray] = []
    for out, widths in ((k, [r[0] for r in rows]), (v, [r[1] for r in rows])):
        for width in widths:
            a = np.frombuffer(body, dtype=np.uint8, count=n_tokens * width, offset=off)
            out.append(a.reshape(n_tokens, width))  # [n_tokens, row_bytes], read-only view
            off += n_tokens * width
    positions.setflags(write=False)
    return BlockKV(block_id=block_id, positions=positions, k=k, v=v), trailer
