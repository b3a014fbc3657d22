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

from .eval_gate import EvalGate, load_gate_library
from .llama_lib import GgmlBase

logger = logging.getLogger(__name__)

_PREFIX = b"Qcur-"


class QueryCapture:
    """Collects, per scored layer, the query rows of the decodes made while armed."""

    def __init__(self, ggml: GgmlBase, layers: Collection[int], *, gate: bool = True) -> None:
        self._ggml = ggml
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
    def layers(self) -> tuple[int, ...]:
        return tuple(sorted(self._wanted.values()))

    def arm(self) -> None:
        """Start collecting; the next decodes' query rows are kept."""
        self._rows = {layer: [] for layer in self._wanted.values()}
        self._armed = True
        if self.gate is not None:
            self.gate.arm()

    def disarm(self) -> dict[int, np.ndarray]:
        """Stop collecting; returns layer -> float32 [n_tokens, n_head, head_dim] in decode order."""
        self._armed = False
        if self.gate is not None:
            self.gate.disarm()
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
        data = self._ggml.read_f32(tensor)  # [1, n_tokens, n_head, head_dim]
        self._rows[layer].append(data.reshape(data.shape[-3:]).copy())
        self.read_ms += (time.perf_counter() - t0) * 1e3
        self.read_bytes += data.nbytes
        return True


def wants_capture(name: bytes) -> bool:
    """Whether a node name is a query node (for tests and diagnostics)."""
    return name.startswith(_PREFIX)
