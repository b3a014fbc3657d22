"""The files that let a session outlive its process: the manifest and block summaries.

`DIR/session.kvm` (the commit point, replaced atomically by rename):

    4s magic b"KVMS"   u32 version   u64 meta_len
    meta: UTF-8 JSON {fingerprint, block_tokens, n_blocks, layout, extra}
    int32 tokens [n_blocks * block_tokens]   (the complete blocks' tokens)
    n_blocks x 16-byte BLAKE2b digests of the block files
    16 bytes: BLAKE2b-128 of everything before it

`DIR/blocks/bNNNNNNNN.sum`: a block's retrieval summary (float32, any shape), tied to the
block file's digest so a summary of another version of the block is never used.

    4s magic b"KVSS"   16s block digest   u32 ndim   ndim x u32 dims   float32 data   16s digest
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kvmem.errors import StoreCorruptError
from kvmem.memory.block_file import DIGEST_BYTES, new_hasher

logger = logging.getLogger(__name__)

MANIFEST_NAME = "session.kvm"
_MAGIC, _SUM_MAGIC, _VERSION = b"KVMS", b"KVSS", 1
_HEAD = struct.Struct("<4sIQ")


@dataclass(slots=True)
class SessionManifest:
    """What a checkpoint commits: complete blocks only (the open block is recomputed)."""

    fingerprint: dict[str, str]
    block_tokens: int
    tokens: np.ndarray  # int32 [n_blocks * block_tokens]
    digests: list[bytes] = field(default_factory=list)  # per block, the block file's digest
    layout: dict[str, Any] = field(default_factory=dict)  # the engine's KV row layout
    # session state beyond the blocks: "frontier" (first position to recompute), and for a
    # conversation of a pool "first_prompt_tokens" and "last_used" (wall-clock seconds)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def n_blocks(self) -> int:
        return len(self.digests)


def _atomic_write(path: Path, parts: list[bytes | memoryview]) -> None:
    """Write `parts` plus their digest to `path` via a fsynced temporary file and rename."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    h = new_hasher()
    try:
        with open(tmp, "wb") as fh:
            for part in parts:
                h.update(part)
                fh.write(part)
            fh.write(h.digest())
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def _verified_body(data: bytes, what: str) -> memoryview:
    buf = memoryview(data)
    if len(buf) < DIGEST_BYTES:
        raise StoreCorruptError(f"{what} is {len(buf)} bytes: too short")
    body = buf[:-DIGEST_BYTES]
    h = new_hasher()
    h.update(body)
    if h.digest() != bytes(buf[-DIGEST_BYTES:]):
        raise StoreCorruptError(f"{what} checksum mismatch (a torn or damaged write)")
    return body


def write_manifest(directory: Path, manifest: SessionManifest) -> None:
    if len(manifest.tokens) != manifest.n_blocks * manifest.block_tokens:
        raise StoreCorruptError(
            f"{len(manifest.tokens)} tokens for {manifest.n_blocks} blocks of {manifest.block_tokens}"
        )
    meta = json.dumps(
        {
            "fingerprint": manifest.fingerprint,
            "block_tokens": manifest.block_tokens,
            "n_blocks": manifest.n_blocks,
            "layout": manifest.layout,
            "extra": manifest.extra,
        },
        sort_keys=True,
    ).encode()
    tokens = np.ascontiguousarray(manifest.tokens, dtype="<i4")
    parts = [_HEAD.pack(_MAGIC, _VERSION, len(meta)), meta, memoryview(tokens).cast("B")]
    parts.append(b"".join(manifest.digests))
    _atomic_write(Path(directory) / MANIFEST_NAME, parts)


def read_manifest(directory: Path) -> SessionManifest | None:
    """The committed manifest, None when there is none; StoreCorruptError when damaged."""
    path = Path(directory) / MANIFEST_NAME
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    body = _verified_body(data, str(path))
    if len(body) < _HEAD.size:
        raise StoreCorruptError(f"{path}: no header")
    magic, version, meta_len = _HEAD.unpack_from(body, 0)
    if magic != _MAGIC or version != _VERSION:
        raise StoreCorruptError(f"{path} is not a version {_VERSION} session manifest")
    off = _HEAD.size
    try:
        meta = json.loads(bytes(body[off : off + meta_len]))
        bt, n_blocks = int(meta["block_tokens"]), int(meta["n_blocks"])
        fingerprint = {str(k): str(v) for k, v in meta["fingerprint"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise StoreCorruptError(f"{path}: bad metadata ({exc})") from None
    off += meta_len
    n_tok = bt * n_blocks
    if len(body) != off + 4 * n_tok + DIGEST_BYTES * n_blocks:
        raise StoreCorruptError(f"{path}: size does not match {n_blocks} blocks")
    tokens = np.frombuffer(body, dtype="<i4", count=n_tok, offset=off).astype(np.int32)
    off += 4 * n_tok
    digests = [
        bytes(body[off + i * DIGEST_BYTES : off + (i + 1) * DIGEST_BYTES]) for i in range(n_blocks)
    ]
    layout, extra = dict(meta.get("layout") or {}), dict(meta.get("extra") or {})
    return SessionManifest(fingerprint, bt, tokens, digests, layout, extra)


def summary_path(directory: Path, block_id: int) -> Path:
    return Path(directory) / "blocks" / f"b{block_id:08d}.sum"


def write_summary(directory: Path, block_id: int, block_digest: bytes, summary: np.ndarray) -> None:
    data = np.ascontiguousarray(summary, dtype="<f4")
    dims = struct.pack(f"<I{data.ndim}I", data.ndim, *data.shape)
    _atomic_write(
        summary_path(directory, block_id),
        [_SUM_MAGIC, block_digest, dims, memoryview(data).cast("B")],
    )


def read_summary(directory: Path, block_id: int, block_digest: bytes) -> np.ndarray | None:
    """The saved summary of exactly this block version; None when missing, stale or damaged."""
    path = summary_path(directory, block_id)
    try:
        body = _verified_body(path.read_bytes(), str(path))
    except FileNotFoundError:
        return None
    except StoreCorruptError as exc:
        logger.info("block %d summary not used: %s", block_id, exc)
        return None
    if bytes(body[:4]) != _SUM_MAGIC or bytes(body[4 : 4 + DIGEST_BYTES]) != block_digest:
        return None
    off = 4 + DIGEST_BYTES
    (ndim,) = struct.unpack_from("<I", body, off)
    shape = struct.unpack_from(f"<{ndim}I", body, off + 4)
    off += 4 + 4 * ndim
    count = int(np.prod(shape))
    if len(body) != off + 4 * count:
        return None
    return np.frombuffer(body, dtype="<f4", count=count, offset=off).reshape(shape).copy()
