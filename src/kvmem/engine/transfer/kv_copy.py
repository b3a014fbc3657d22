"""Native gather/scatter of KV rows (native/kv_copy.c): one call per blob build or split.

The restore blob (every block's K rows, V rows or V transposed, per layer) and the harvest
split (the blob's rows into per-block buffers) are thousands of row copies; numpy does them
one array at a time, each a Python call holding the GIL. A `CopyPlan` collects them as ops
(numpy records, built a layer or a layout at a time) and `run` hands them to C in one ctypes
call, which releases the GIL and splits the bytes over `threads` pthreads. The bytes written
are the numpy path's (state_codec, the fallback and the reference; tests compare both).
`KVMEM_NATIVE_COPY=0`, or no C compiler, selects the numpy path.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
from collections.abc import Sequence

import numpy as np

from kvmem.errors import StateFormatError

from ..llama.native_lib import load_native

logger = logging.getLogger(__name__)

Broadcast = np.ndarray | Sequence[int] | int  # values np.broadcast_arrays accepts

# struct kvmem_copy_op (native/kv_copy.c)
OP_DTYPE = np.dtype(
    [
        ("dst", "<u8"),
        ("src", "<u8"),
        ("n_outer", "<u8"),
        ("n_inner", "<u8"),
        ("el", "<u8"),
        ("dst_outer", "<i8"),
        ("src_outer", "<i8"),
        ("dst_inner", "<i8"),
        ("src_inner", "<i8"),
    ]
)

_LIB: ctypes.CDLL | None = None
MAX_COPY_THREADS = 8  # copy_threads() default cap
_LOADED = False
_LOCK = threading.Lock()


def address(a: np.ndarray) -> int:
    """The address of a C-contiguous array's first byte."""
    try:  # the cheapest way from Python (a writable buffer)
        return ctypes.addressof(ctypes.c_char.from_buffer(a))
    except (TypeError, ValueError):  # read-only or empty
        return int(a.__array_interface__["data"][0])


class NativeCopy:
    """The loaded library and the threads each call splits its bytes over."""

    def __init__(self, lib: ctypes.CDLL, threads: int) -> None:
        self._lib = lib
        self.threads = max(1, threads)

    def plan(self) -> CopyPlan:
        return CopyPlan(self)

    def run(self, ops: np.ndarray) -> None:
        """Execute ops (OP_DTYPE [n_ops]); the GIL is released meanwhile."""
        if len(ops):
            self._lib.kvmem_copy(address(ops), len(ops), self.threads)


def native_copy(threads: int) -> NativeCopy | None:
    """The native copy on `threads` threads, or None: KVMEM_NATIVE_COPY=0, or it cannot be
    built (logged once)."""
    global _LIB, _LOADED
    if os.environ.get("KVMEM_NATIVE_COPY", "1") == "0":
        return None
    with _LOCK:
        if not _LOADED:
            _LOADED = True
            _LIB = load_native("kv_copy", ["-pthread"])
            if _LIB is not None:
                _LIB.kvmem_copy.restype = ctypes.c_int
                _LIB.kvmem_copy.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int]
    return None if _LIB is None else NativeCopy(_LIB, threads)


class CopyPlan:
    """Copies collected for one native call. Sources must stay alive until `run`."""

    def __init__(self, native: NativeCopy) -> None:
        self._native = native
        self._ops: list[np.ndarray] = []  # OP_DTYPE [n] each
        self._keep: list[np.ndarray] = []  # contiguous copies of sources, alive until run
        self.bytes = 0

    def add(
        self,
        dst: Broadcast,
        src: Broadcast,
        el: Broadcast,
        *,
        n_outer: Broadcast = 1,
        n_inner: Broadcast = 1,
        strides: tuple[Broadcast, Broadcast, Broadcast, Broadcast] = (0, 0, 0, 0),
    ) -> None:
        """One op per element of the broadcast of the arguments: `dst`, `src` addresses,
        `el` element bytes; with n_outer/n_inner > 1, `strides` are (dst_outer, src_outer,
        dst_inner, src_inner) in bytes."""
        values = [np.asarray(x, np.uint64) for x in (dst, src, n_outer, n_inner, el)]
        values += [np.asarray(x, np.int64) for x in strides]
        ops = np.empty(np.broadcast_shapes(*(v.shape for v in values)), dtype=OP_DTYPE)
        for name, v in zip(OP_DTYPE.names or (), values, strict=True):
            ops[name] = v  # broadcast on assignment
        ops = ops.ravel()  # [n_ops]
        self._ops.append(ops)
        self.bytes += int((ops["el"] * ops["n_outer"] * ops["n_inner"]).sum())

    def concat(self, dst: np.ndarray, parts: Sequence[np.ndarray]) -> None:
        """dst (uint8 [n_cells, row_bytes]) = the rows of `parts`, one after the other."""
        arrays, addresses = self._rows(parts, dst.shape[1])
        sizes = np.array([a.nbytes for a in arrays], dtype=np.uint64)  # [n_parts]
        if int(sizes.sum()) != dst.nbytes:
            raise StateFormatError(f"{int(sizes.sum())} bytes of rows for {dst.nbytes}")
        offsets = np.cumsum(sizes) - sizes  # [n_parts]
        self.add(address(dst) + offsets, addresses, sizes)

    def to_columns(self, dst: np.ndarray, parts: Sequence[np.ndarray], el: int) -> None:
        """dst (uint8 [n_embd_v * n_cells * el]) = the V rows of `parts` transposed
        (channels x cells), as llama.cpp stores V without flash attention."""
        row = dst.nbytes // max(1, sum(len(p) for p in parts))
        arrays, addresses = self._rows(parts, row)
        n_cells = sum(len(a) for a in arrays)
        if n_cells * row != dst.nbytes:
            raise StateFormatError(f"{n_cells} V rows of {row} bytes for {dst.nbytes} bytes")
        counts = np.array([len(a) for a in arrays], dtype=np.int64)  # [n_parts]
        at = np.cumsum(counts) - counts  # [n_parts] first cell of each part
        self.add(
            address(dst) + at * el,
            addresses,
            el,
            n_outer=row // el,
            n_inner=counts,
            strides=(n_cells * el, el, el, row),
        )

    def run(self) -> float:
        """Execute every op collected; returns the ms it took."""
        t0 = time.perf_counter()
        ops = np.concatenate(self._ops) if self._ops else np.empty(0, OP_DTYPE)  # [n_ops]
        self._native.run(ops)
        self._ops, self._keep = [], []
        return (time.perf_counter() - t0) * 1e3

    def _rows(
        self, parts: Sequence[np.ndarray], row_bytes: int
    ) -> tuple[list[np.ndarray], list[int]]:
        """`parts` as C-contiguous uint8 [n, row_bytes] arrays (copied only where not),
        and their addresses."""
        arrays, addresses = [], []
        for p in parts:
            if p.shape[1:] != (row_bytes,) or p.dtype != np.uint8:
                raise StateFormatError(f"rows {p.dtype} {p.shape}, {row_bytes} bytes expected")
            try:  # the cheapest address from Python: C-contiguous, writable, not empty
                at = ctypes.addressof(ctypes.c_char.from_buffer(p))
            except (TypeError, ValueError, BufferError):
                if not p.flags.c_contiguous:
                    p = np.ascontiguousarray(p)
                    self._keep.append(p)
                at = int(p.__array_interface__["data"][0])
            arrays.append(p)
            addresses.append(at)
        return arrays, addresses


def copy_threads() -> int:
    """Threads for the copy-out and the restore blob (the native copy's pthreads, or
    numpy's copy threads): KVMEM_COPY_THREADS, else CPUs / 2 (at most 8: on the 16-core
    H200 host, 8 threads built restore blobs at 21.9 GB/s and split harvests at 18.8 GB/s,
    against 14.4 and 13.7 with 4). One means no copy threads: everything on the caller's
    thread."""
    env = os.environ.get("KVMEM_COPY_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    return max(1, min(MAX_COPY_THREADS, (os.cpu_count() or 1) // 2))
