"""OpenBLAS's own thread count, set to one while Python threads run products side by side.

OpenBLAS runs one multi-threaded product at a time: products called from several Python
threads at once wait for each other. Scoring on `workers` threads therefore asks OpenBLAS
for one thread per product (`single_threaded_blas`) so that the workers' products run in
parallel, and restores the count afterwards. The library is the OpenBLAS that numpy
loaded, found in /proc/self/maps; where there is none (another BLAS, another system) the
context does nothing.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

_PREFIXES = ("scipy_openblas", "openblas")
_SUFFIXES = ("64_", "")  # numpy's bundled ILP64 build, then a plain one


@dataclass(slots=True)
class _Blas:
    get: Callable[[], int]
    set: Callable[[int], None]
    lock: threading.Lock
    depth: int = 0  # contexts open
    saved: int = 0  # the thread count before the first one


@functools.cache
def _blas() -> _Blas | None:
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    paths = sorted({line.split()[-1] for line in maps.splitlines() if "openblas" in line.lower()})
    for path in (p for p in paths if p.startswith("/")):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix in _PREFIXES:
            for suffix in _SUFFIXES:
                get = getattr(lib, f"{prefix}_get_num_threads{suffix}", None)
                put = getattr(lib, f"{prefix}_set_num_threads{suffix}", None)
                if get is not None and put is not None:
                    get.restype, get.argtypes = ctypes.c_int, []
                    put.restype, put.argtypes = None, [ctypes.c_int]
                    logger.debug("OpenBLAS thread control: %s (%s)", path, prefix + suffix)
                    return _Blas(get, put, threading.Lock())
    return None


def blas_threads() -> int | None:
    """OpenBLAS's thread count now, or None when numpy's BLAS is not a known OpenBLAS."""
    blas = _blas()
    return None if blas is None else int(blas.get())


@contextmanager
def single_threaded_blas() -> Iterator[None]:
    """OpenBLAS on one thread per call while any such context is open (nestable, and
    shared by threads: the count is restored when the last one closes)."""
    blas = _blas()
    if blas is None:
        yield
        return
    with blas.lock:
        if blas.depth == 0:
            blas.saved = int(blas.get())
            blas.set(1)
        blas.depth += 1
    try:
        yield
    finally:
        with blas.lock:
            blas.depth -= 1
            if blas.depth == 0:
                blas.set(blas.saved)
