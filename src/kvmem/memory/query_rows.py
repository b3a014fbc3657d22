"""The main context's query rows, kept by position across turns.

With `--kvmem-query-source main` the query vectors are the post-RoPE query rows the main
context computes while it decodes (query_capture.py). An agent loop appends a short tool
result to a prefix the session holds already, so most of its query (the task, the
trajectory's tail) was decoded in earlier turns, where it was not yet a query span. So
every prefill keeps the rows of the positions a later query may cover (its own query
spans and the prompt's tail), and a turn assembles each span from them.

A row at position p is a function of the KV before p and the token at p. The KV the
session reuses is the KV a fresh server computes for the same tokens (the frontier makes
sure), so a kept row is the row a fresh server computes: a query assembled from kept rows
equals one captured in a single prefill. Rows at and after a cut go with the history.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from kvmem.memory.scorer import QueryVectors
from kvmem.memory.spans import TokenSpan


@dataclass(slots=True)
class RowRun:
    """Rows of consecutive positions from `start`."""

    start: int
    rows: dict[int, np.ndarray]  # layer -> float32 [n_tokens, n_head, head_dim]

    @property
    def end(self) -> int:
        return self.start + len(next(iter(self.rows.values())))

    def clipped(self, lo: int, hi: int) -> RowRun | None:
        """The part of the run inside [lo, hi), or None."""
        a, b = max(lo, self.start), min(hi, self.end)
        if a >= b:
            return None
        return RowRun(a, {k: v[a - self.start : b - self.start] for k, v in self.rows.items()})


class QueryRows:
    """Non-overlapping runs of rows, ascending by position."""

    def __init__(self) -> None:
        self._runs: list[RowRun] = []

    @property
    def runs(self) -> tuple[RowRun, ...]:
        return tuple(self._runs)

    @property
    def n_positions(self) -> int:
        return sum(r.end - r.start for r in self._runs)

    def add(self, start: int, rows: dict[int, np.ndarray]) -> None:
        """Keep rows from `start` on (newer rows replace kept ones at the same positions)."""
        if not rows or not len(next(iter(rows.values()))):
            return
        run = RowRun(start, rows)
        kept = [p for r in self._runs for p in (r.clipped(0, start), r.clipped(run.end, 1 << 62))]
        self._runs = sorted([r for r in kept if r is not None] + [run], key=lambda r: r.start)

    def truncate(self, n_keep: int) -> None:
        """Forget the rows at and after `n_keep` (the history from there is recomputed)."""
        clipped = (r.clipped(0, n_keep) for r in self._runs)
        self._runs = [r for r in clipped if r is not None]

    def keep_only(self, spans: Iterable[TokenSpan]) -> None:
        """Forget every row outside `spans` (what the next turns' queries may cover)."""
        parts = [r.clipped(s.start, s.end) for s in merged(spans) for r in self._runs]
        self._runs = sorted((p for p in parts if p is not None), key=lambda r: r.start)

    def clear(self) -> None:
        self._runs = []

    def first_missing(self, span: TokenSpan, before: int) -> int | None:
        """The first position of `span` before `before` with no row, or None."""
        p, end = span.start, min(span.end, before)
        for r in self._runs:
            if p >= end:
                break
            if r.end <= p:
                continue
            if r.start > p:
                return p
            p = r.end
        return p if p < end else None

    def vectors(self, span: TokenSpan) -> QueryVectors | None:
        """The span's query vectors, or None when a position has no row."""
        if span.length <= 0 or self.first_missing(span, span.end) is not None:
            return None
        clipped = (r.clipped(span.start, span.end) for r in self._runs)
        parts = [p for p in clipped if p is not None]
        layers = set.intersection(*(set(p.rows) for p in parts))
        return QueryVectors(
            positions=np.arange(span.start, span.end, dtype=np.int64),  # [n_tokens]
            by_layer={k: np.concatenate([p.rows[k] for p in parts]) for k in sorted(layers)},
        )


def merged(spans: Iterable[TokenSpan]) -> list[TokenSpan]:
    """The union of `spans` as ascending, disjoint spans."""
    out: list[TokenSpan] = []
    for s in sorted((s for s in spans if s.length > 0), key=lambda s: s.start):
        if out and s.start <= out[-1].end:
            out[-1] = TokenSpan(out[-1].start, max(out[-1].end, s.end))
        else:
            out.append(s)
    return out
