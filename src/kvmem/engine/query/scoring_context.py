"""Query vectors from a second, small context (`--kvmem-query-source scoring`).

With an eval callback installed, llama.cpp's scheduler synchronizes after every graph
split of every decode (the callback branch of ggml_backend_sched_compute_splits), so the
host cannot prepare one ubatch while the GPU computes the last. On the H200 that cost
KVMem 15% of its prefill: 0.80x stock at 32K with the callback, 0.94x without
(docs/benchmarks.md, session 6). With this source the main context carries no callback.
The scoring context shares the model's weights, holds the sink and one query span, and
carries the capture's callback. For each span it decodes the sink tokens right before the
span's own positions, then the span, and keeps the span's query rows: the same positions
as on the main context, but the rows have seen the sink and the span only, not the window.
What that costs in recall is measured in docs/benchmarks.md.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np

from kvmem.memory.spans import TokenSpan

from ..llama.context import ContextSettings, LlamaContext
from ..llama.model import LlamaModel
from .query_capture import QueryCapture

logger = logging.getLogger(__name__)

_CELL_ROUND = 256


class ScoringContext:
    """A small llama context that computes the query rows of token spans."""

    def __init__(
        self,
        model: LlamaModel,
        settings: ContextSettings,
        capture: QueryCapture,
        sink_tokens: int,
        max_span_tokens: int,
    ) -> None:
        need = sink_tokens + max_span_tokens
        cells = -(-need // _CELL_ROUND) * _CELL_ROUND
        small = replace(settings, n_cells=cells, n_seq_max=1, n_rs_seq=0, draft_mtp=False)
        self.ctx = LlamaContext(model, small, capture.callback, capture.user_data)
        self.capture = capture
        self.sink_tokens = sink_tokens
        self.max_span_tokens = max_span_tokens
        # decodes on this context beside the main prefill (query_ahead.py); one at a time
        self.worker = ThreadPoolExecutor(1, "kvmem-scoring")
        logger.info("scoring context: %d cells (sink %d + query %d)", cells, sink_tokens, need)

    def query_rows(
        self, prompt: Sequence[int], spans: Sequence[TokenSpan]
    ) -> dict[TokenSpan, dict[int, np.ndarray]]:
        """span -> layer -> float32 [span.length, n_head, head_dim], each span computed
        after the sink at its own positions."""
        return {span: self._span_rows(prompt, span) for span in spans}

    def _span_rows(self, prompt: Sequence[int], span: TokenSpan) -> dict[int, np.ndarray]:
        assert span.length <= self.max_span_tokens, (span, self.max_span_tokens)
        head = min(self.sink_tokens, span.start)  # the sink's tokens before the span
        tokens = [*prompt[:head], *prompt[span.start : span.end]]
        start = span.start - head  # the sink sits right before the span
        self.ctx.clear()
        parts: dict[int, list[np.ndarray]] = {}
        for c0 in range(0, len(tokens), self.ctx.n_batch):
            chunk = tokens[c0 : c0 + self.ctx.n_batch]
            self.capture.arm(len(chunk))
            try:
                self.ctx.decode(chunk, start + c0, [False] * len(chunk))
            finally:
                got = self.capture.disarm()
            for layer, rows in got.items():
                parts.setdefault(layer, []).append(rows)
        # [span.length, n_head, head_dim] per layer: the span's rows, the sink's dropped
        return {layer: np.concatenate(p, axis=0)[head:] for layer, p in parts.items()}

    def close(self) -> None:
        self.worker.shutdown(wait=True)
        self.ctx.close()
