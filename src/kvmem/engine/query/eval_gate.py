"""The native gate in front of the eval callback (native/eval_gate.c), built on first use.

llama.cpp calls the eval callback for every graph node of every decode. With the gate,
llama.cpp calls a C function that answers "not needed" at once unless armed, so decode
steps outside the query pass never enter Python. The library is built by native_lib
(once per source hash, with `cc`). Without a compiler the caller falls back to the plain
Python callback and logs why.
"""

from __future__ import annotations

import ctypes
import logging
import os

from ..llama.native_lib import load_native

logger = logging.getLogger(__name__)


class _GateState(ctypes.Structure):
    """struct kvmem_eval_gate (native/eval_gate.c)."""

    _fields_ = [
        ("armed", ctypes.c_int),
        ("inner", ctypes.c_void_p),
        ("inner_user_data", ctypes.c_void_p),
        ("calls", ctypes.c_ulonglong),
        ("forwarded", ctypes.c_ulonglong),
    ]


class EvalGate:
    """Holds the gate's state; `pointer` and `user_data` go into the context params."""

    def __init__(self, lib: ctypes.CDLL, inner: object) -> None:
        self._lib = lib  # keep the library loaded while contexts use it
        self._inner = inner  # the ctypes callback object, kept alive
        self._state = _GateState(0, ctypes.cast(inner, ctypes.c_void_p).value, None, 0, 0)
        self.pointer = ctypes.cast(lib.kvmem_eval_gate, ctypes.c_void_p).value
        self.user_data = ctypes.cast(ctypes.pointer(self._state), ctypes.c_void_p).value

    def arm(self) -> None:
        self._state.armed = 1

    def disarm(self) -> None:
        self._state.armed = 0

    def reset_counters(self) -> None:
        self._state.calls = 0
        self._state.forwarded = 0

    @property
    def calls(self) -> int:
        """Eval-callback calls seen by the gate (every graph node of every decode)."""
        return int(self._state.calls)

    @property
    def forwarded(self) -> int:
        """Calls passed on to the Python callback (only while armed)."""
        return int(self._state.forwarded)


def load_gate_library() -> ctypes.CDLL | None:
    """The compiled gate, building it if needed; None (with the reason logged) when no C
    compiler is available or the build fails. KVMEM_EVAL_GATE=0 turns the gate off."""
    if os.environ.get("KVMEM_EVAL_GATE", "1") == "0":
        logger.info("eval gate off (KVMEM_EVAL_GATE=0): the eval callback runs in Python")
        return None
    lib = load_native("eval_gate")
    if lib is None:
        return None
    lib.kvmem_eval_gate.restype = ctypes.c_bool
    lib.kvmem_eval_gate.argtypes = [ctypes.c_void_p, ctypes.c_bool, ctypes.c_void_p]
    return lib
