"""Capturing the post-RoPE query vectors of the retrieval query through llama.cpp's eval callback.

The callback is fixed when the context is created and runs for every graph node of
every decode, so it answers "not needed" at once unless armed. While armed it asks
for the `Qcur-<layer>` nodes whose op is ROPE (the query after RoPE, before any
Hadamard rotation of a quantized cache) and copies them to the host.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection

import llama_cpp
import numpy as np

from ..llama.host_staging import StagingBuffer
from ..llama.llama_lib import GgmlBase, pinned_staging
from .capture_arena import ARENA_MAX, CaptureArena
from .eval_gate import EvalGate, load_gate_library

logger = logging.getLogger(__name__)

_PREFIX = b"Qcur-"


class QueryCapture:
    """Collects, per scored layer, the query rows of the decodes made while armed."""

    def __init__(
        self,
        ggml: GgmlBase,
        layers: Collection[int],
        *,
        gate: bool = True,
        staging: StagingBuffer | None = None,
    ) -> None:
        self._ggml = ggml
        self._arena = CaptureArena(staging) if staging is not None else None
        self._token_bytes: dict[int, int] = {}  # layer -> bytes of one token's query row
        self._wanted = {f"Qcur-{layer}".encode(): layer for layer in layers}
        self._armed = False
        self._rows: dict[int, list[np.ndarray]] = {}
        self._python_callback = llama_cpp.ggml_backend_sched_eval_callback(self._on_node)
        lib = load_gate_library() if gate else None
        self.gate = EvalGate(lib, self._python_callback) if lib is not None else None
        # what the context is created with: the native gate, or the Python callback itself
        self.callback = (
            llama_cpp.ggml_backend_sched_eval_callback(self.gate.pointer)
            if self.gate is not None
            else self._python_callback
        )
        self.user_data: int | None = self.gate.user_data if self.gate is not None else None
        self.n_calls = 0  # calls that reached Python
        self.read_ms = 0.0  # time spent copying query rows to the host
        self.read_bytes = 0

    def reset_counters(self) -> None:
        self.n_calls, self.read_ms, self.read_bytes = 0, 0.0, 0
        if self.gate is not None:
            self.gate.reset_counters()

    @property
    def node_calls(self) -> int:
        """Eval-callback calls made by llama.cpp (all nodes; known only with the gate)."""
        return self.gate.calls if self.gate is not None else self.n_calls

    @property
    def arena_bytes(self) -> int:
        """Bytes of the last armed pass that went through the page-locked arena."""
        return self._arena.used if self._arena is not None else 0

    @property
    def layers(self) -> tuple[int, ...]:
        return tuple(sorted(self._wanted.values()))

    def arm(self, n_tokens: int = 0) -> None:
        """Start collecting; the next decodes' query rows (`n_tokens` of them, if known,
        which sizes the arena) are kept."""
        if self._arena is not None:
            self._arena.start(n_tokens * sum(self._token_bytes.values()))
        self._rows = {layer: [] for layer in self._wanted.values()}
        self._armed = True
        if self.gate is not None:
            self.gate.arm()

    def disarm(self) -> dict[int, np.ndarray]:
        """Stop collecting; returns layer -> float32 [n_tokens, n_head, head_dim] in decode order."""
        self._armed = False
        if self.gate is not None:
            self.gate.disarm()
        # concatenate copies: nothing returned points into the arena
        out = {layer: np.concatenate(parts, axis=0) for layer, parts in self._rows.items() if parts}
        self._rows = {}
        return out

    def _on_node(self, tensor: int, ask: bool, _user: int) -> bool:
        if not self._armed:
            return False
        self.n_calls += 1
        layer = self._wanted.get(self._ggml.name(tensor))
        if layer is None or self._ggml.op_of(tensor) != "ROPE":
            return False
        if ask:
            return True
        t0 = time.perf_counter()
        n_bytes = self._ggml.nbytes(tensor)
        into = self._arena.take(n_bytes) if self._arena is not None else None
        data = self._ggml.read_f32(tensor, into)  # [1, n_tokens, n_head, head_dim]
        rows = data.reshape(data.shape[-3:])  # [n_tokens, n_head, head_dim]
        self._token_bytes[layer] = n_bytes // max(1, rows.shape[0])
        self._rows[layer].append(rows)
        self.read_ms += (time.perf_counter() - t0) * 1e3
        self.read_bytes += data.nbytes
        return True


def wants_capture(name: bytes) -> bool:
    """Whether a node name is a query node (for tests and diagnostics)."""
    return name.startswith(_PREFIX)


def capture_staging() -> StagingBuffer | None:
    """Page-locked memory for the capture's arena where the GPU backend offers it (on a
    CPU build a read into plain memory is already a memcpy, so none)."""
    return pinned_staging(ARENA_MAX)
