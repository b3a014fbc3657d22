"""The project's small C libraries (engine/llama/native/*.c), compiled on first use.

Each library is compiled once per source hash into the user's cache directory with the
system C compiler (`cc`, which building llama-cpp-python from source needs anyway) and
loaded with ctypes. Without a compiler, or when the build fails, `load_native` returns
None and logs why; every caller has a Python path for that case.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

logger = logging.getLogger(__name__)

NATIVE_DIR = Path(__file__).with_name("native")


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kvmem" / "native"


def load_native(name: str, flags: Sequence[str] = ()) -> ctypes.CDLL | None:
    """native/<name>.c compiled (with `flags`) and loaded, building it if needed; None
    when it cannot be built (the reason logged as a warning)."""
    source = NATIVE_DIR / f"{name}.c"
    digest = hashlib.sha256(source.read_bytes() + " ".join(flags).encode()).hexdigest()[:16]
    target = cache_dir() / f"{name}-{digest}.so"
    if not target.exists():
        error = _build(source, target, flags)
        if error is not None:
            logger.warning("native %s unavailable (%s): using the Python path", name, error)
            return None
    return ctypes.CDLL(str(target))


def _build(source: Path, target: Path, flags: Sequence[str]) -> str | None:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return "no C compiler (cc) on PATH"
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        out = Path(tmp) / target.name
        cmd = [compiler, "-O2", "-shared", "-fPIC", *flags, "-o", str(out), str(source)]
        try:
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{compiler} failed: {exc}"
        if run.returncode != 0:
            return f"{compiler} exited {run.returncode}: {run.stderr.strip()[:200]}"
        os.replace(out, target)  # atomic: concurrent builders leave one complete file
    return None
