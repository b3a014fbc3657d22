"""Capturing the post-RoPE query vectors of the retrieval query through llama.cpp's eval callback.

The callback is fixed when the context is created and runs for every graph node of
every decode, so it answers "not needed" at once unless armed. While armed it asks
for the `Qcur-<layer>` nodes whose op is ROPE (the query after RoPE, before any
Hadamard rotation of a quantized cache) and copies them to the host.
"""

from __future__ import annotations

import logging
from collections.abc import Collection

import llama_cpp
import numpy as np

from .llama_lib import GgmlBase

logger = logging.getLogger(__name__)

_PREFIX = b"Qcur-"


class QueryCapture:
    """Collects, per scored layer, the query rows of the decodes made while armed."""

    def __init__(self, ggml: GgmlBase, layers: Collection[int]) -> None:
        self._ggml = ggml
        self._wanted = {f"Qcur-{layer}".encode(): layer for layer in layers}
        self._armed = False
        self._rows: dict[int, list[np.ndarray]] = {}
        self.callback = llama_cpp.ggml_backend_sched_eval_callback(self._on_node)
        self.n_calls = 0

    @property
    def layers(self) -> tuple[int, ...]:
        return tuple(sorted(self._wanted.values()))

    def arm(self) -> None:
        """Start collecting; the next decodes' query rows are kept."""
        self._rows = {layer: [] for layer in self._wanted.values()}
        self._armed = True

    def disarm(self) -> dict[int, np.ndarray]:
        """Stop collecting; returns layer -> float32 [n_tokens, n_head, head_dim] in decode order."""
        self._armed = False
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
        data = self._ggml.read_f32(tensor)  # [1, n_tokens, n_head, head_dim]
        self._rows[layer].append(data.reshape(data.shape[-3:]).copy())
        return True


def wants_capture(name: bytes) -> bool:
    """Whether a node name is a query node (for tests and diagnostics)."""
    return name.startswith(_PREFIX)
