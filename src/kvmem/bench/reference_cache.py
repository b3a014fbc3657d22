"""The full-context reference logits of a fidelity run, kept on disk between runs.

Every variant of one fidelity protocol scores against the same reference (the full
context teacher-forced over the same transcript), so `--reference-cache DIR` computes it
once: the file is named by a hash of what the logits depend on (the model file, the
context and batch sizes, the cache types, GPU layers and every turn's tokens), so a run
with other settings or another transcript never reads it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)


def reference_key(settings: dict[str, object], turns: Sequence[tuple[list[int], list[int]]]) -> str:
    """Hex digest of the settings (JSON-able) and every (prompt, continuation) pair."""
    h = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode())
    for prompt, continuation in turns:
        h.update(np.asarray(prompt, dtype=np.int64).tobytes())
        h.update(b"|")
        h.update(np.asarray(continuation, dtype=np.int64).tobytes())
        h.update(b";")
    return h.hexdigest()[:24]


def load_reference(directory: str | None, key: str, n_turns: int) -> list[np.ndarray] | None:
    """The cached logits (float32 [n_cont, n_vocab] per turn), or None when absent."""
    if directory is None:
        return None
    path = Path(directory) / f"fidelity-ref-{key}.npz"
    if not path.exists():
        return None
    with np.load(path) as data:
        out = [np.asarray(data[f"t{i}"], dtype=np.float32) for i in range(n_turns)]
    logger.info("reference logits from %s", path)
    return out


def save_reference(directory: str | None, key: str, logits: Sequence[np.ndarray]) -> None:
    """Write the logits atomically (a temporary file renamed into place)."""
    if directory is None:
        return
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"fidelity-ref-{key}.npz"
    tmp = folder / f".fidelity-ref-{key}.{os.getpid()}.npz"
    np.savez(tmp, **{f"t{i}": a for i, a in enumerate(logits)})
    os.replace(tmp, path)
    logger.info("reference logits written to %s", path)
