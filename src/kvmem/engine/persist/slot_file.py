"""Saving and restoring the KVMem session to a file (`--slot-save-path`, `POST /slots/0`).

A slot file holds the session's token history and the identity of the model it was made
with: the magic `KVMSLOT1`, a little-endian u32 length, a JSON header (model file size and
digest as in `model_path.model_file_identity`, the token count) and the tokens as
int32. The KV itself is not in the file: restoring resets the session and processes the
saved history as one prompt (teacher forcing, nothing is sampled), so the blocks, the
host store, the retrieval summaries and the window are rebuilt by the same code as any
prefill, and the next request that shares the history reuses it. The restart-safe store
with the KV bytes on disk is `--kvmem-disk-dir` (session_persist.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kvmem.errors import InvalidRequestError
from kvmem.gguf.model_path import model_file_identity

MAGIC = b"KVMSLOT1"
_LEN = struct.Struct("<I")


@dataclass(frozen=True, slots=True)
class SlotResult:
    n_tokens: int
    n_bytes: int
    ms: float


def _identity(engine: Any) -> dict[str, Any]:
    size, digest = model_file_identity(engine.model.path)
    return {"model_size": size, "model_digest": digest}


def save_slot(engine: Any, path: Path) -> SlotResult:
    """Write the session's history to `path` (atomically: a temporary file, then rename)."""
    t0 = time.perf_counter()
    tokens = np.asarray(engine.session.tokens, dtype="<i4")  # [n]
    header = json.dumps({**_identity(engine), "n_tokens": int(tokens.shape[0])}).encode()
    data = MAGIC + _LEN.pack(len(header)) + header + tokens.tobytes()
    # a short temporary name: `path`'s own may already be the longest the file system takes
    fd, tmp = tempfile.mkstemp(prefix=".slot-", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return SlotResult(int(tokens.shape[0]), len(data), (time.perf_counter() - t0) * 1e3)


def read_slot(path: Path) -> tuple[dict[str, Any], list[int], int]:
    """(header, tokens, bytes read); InvalidRequestError when it is not a slot file."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise InvalidRequestError(f"Unable to restore slot: no file {path.name}") from None
    except OSError as exc:
        raise InvalidRequestError(f"Unable to restore slot: {exc.strerror or exc}") from None
    start = len(MAGIC) + _LEN.size
    if not data.startswith(MAGIC) or len(data) < start:
        raise InvalidRequestError("Unable to restore slot: not a kvmem slot file")
    (n_header,) = _LEN.unpack_from(data, len(MAGIC))
    try:
        header = json.loads(data[start : start + n_header])
        body = data[start + n_header :]
        tokens = np.frombuffer(body, dtype="<i4").tolist() if len(body) % 4 == 0 else None
    except (ValueError, UnicodeDecodeError):
        header, tokens = None, None
    if not isinstance(header, dict) or tokens is None or header.get("n_tokens") != len(tokens):
        raise InvalidRequestError("Unable to restore slot: the slot file is damaged")
    return header, tokens, len(data)


def restore_slot(engine: Any, path: Path) -> SlotResult:
    """Replace the session with the saved history; returns the tokens restored."""
    t0 = time.perf_counter()
    header, tokens, n_read = read_slot(path)
    mine = _identity(engine)
    if any(header.get(k) != v for k, v in mine.items()):
        raise InvalidRequestError("Unable to restore slot: it was saved with another model")
    n_vocab = engine.info.n_vocab
    if any(t < 0 or t >= n_vocab for t in tokens):
        raise InvalidRequestError("Unable to restore slot: invalid tokens in slot save file")
    if len(tokens) >= engine.info.n_ctx:
        raise InvalidRequestError(
            "Unable to restore slot: the restored history does not fit the context"
        )
    engine.reset()
    if tokens:
        engine.teacher_force(tokens, [tokens[-1]])  # processes `tokens`; samples nothing
    return SlotResult(len(tokens), n_read, (time.perf_counter() - t0) * 1e3)


def erase_slot(engine: Any) -> SlotResult:
    n = len(engine.session.tokens)
    engine.reset()
    return SlotResult(n, 0, 0.0)
