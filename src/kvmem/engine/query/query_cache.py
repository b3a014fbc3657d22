"""QueryCache: the query vectors of recent spans, for the turns that do not decode them.

A span's vectors are a function of its tokens at their positions, so they are kept under
(start, tokens) and reused by a later turn whose prompt holds the same span.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from kvmem.memory.lexical import LexicalQuery
from kvmem.memory.scorer import QueryVectors
from kvmem.memory.spans import TokenSpan

QUERY_CACHE = 8  # query spans whose vectors are kept for later turns

QueryKey = tuple[int, tuple[int, ...]]
SpanRows = Mapping[TokenSpan, Mapping[int, np.ndarray]]  # span -> layer -> [tokens, dim]


def query_key(span: TokenSpan, prompt: Sequence[int]) -> QueryKey:
    """The cache's key: a span's vectors are the same for the same tokens at the same
    positions."""
    return span.start, tuple(prompt[span.start : span.end])


def span_query(span: TokenSpan, rows: Mapping[int, np.ndarray]) -> QueryVectors | None:
    """A span's vectors from its rows of this turn, or None when they are not all there."""
    if not rows or any(len(r) != span.length for r in rows.values()):
        return None
    positions = np.arange(span.start, span.end, dtype=np.int64)  # [n_tokens]
    return QueryVectors(positions=positions, by_layer=dict(rows))


def join_queries(parts: Sequence[QueryVectors]) -> QueryVectors | None:
    """One query of several spans' vectors (the layers every part has)."""
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0]
    layers = set.intersection(*(set(p.by_layer) for p in parts))
    return QueryVectors(
        positions=np.concatenate([p.positions for p in parts]),  # [n_tokens]
        by_layer={k: np.concatenate([p.by_layer[k] for p in parts]) for k in sorted(layers)},
    )


class QueryCache:
    """The vectors of the last `size` query spans, least recently used first out."""

    def __init__(self, size: int = QUERY_CACHE) -> None:
        self.size = size
        self._vectors: collections.OrderedDict[QueryKey, QueryVectors] = collections.OrderedDict()

    def __contains__(self, key: QueryKey) -> bool:
        return key in self._vectors

    def missing(self, wanted: Sequence[TokenSpan], prompt: Sequence[int]) -> list[TokenSpan]:
        """The wanted spans with no kept vectors."""
        return [s for s in wanted if query_key(s, prompt) not in self._vectors]

    def keep(self, wanted: Sequence[TokenSpan], captured: SpanRows, prompt: Sequence[int]):
        """Keep the spans captured this turn and mark the kept ones used; returns the spans
        that have vectors neither way."""
        missing = []
        for span in wanted:
            key = query_key(span, prompt)
            got = span_query(span, captured.get(span, {}))
            if got is not None:
                self._vectors[key] = got
                while len(self._vectors) > self.size:
                    self._vectors.popitem(last=False)
            if key in self._vectors:
                self._vectors.move_to_end(key)
            else:
                missing.append(span)
        return missing

    def joined(
        self,
        wanted: Sequence[TokenSpan],
        captured: SpanRows,
        prompt: Sequence[int],
        lexical: Sequence[TokenSpan],
    ) -> QueryVectors | None:
        """The query of the wanted spans, from `captured` or the kept vectors, with the
        tokens of the `lexical` spans; reads only (a worker thread calls it while the
        prefill runs)."""
        parts = []
        for span in wanted:
            got = span_query(span, captured.get(span, {}))
            got = got if got is not None else self._vectors.get(query_key(span, prompt))
            if got is not None:
                parts.append(got)
        query = join_queries(parts)
        if query is None:
            return None
        return replace(query, lexical=LexicalQuery.of(prompt, lexical))

    def clear(self) -> None:
        self._vectors.clear()
