"""QueryCache (the vectors of recent query spans) and the null recurrent hook."""

from __future__ import annotations

import numpy as np

from kvmem.engine.hybrid.recurrent_hook import NullRecurrent
from kvmem.engine.query.query_cache import QueryCache, query_key
from kvmem.memory.spans import PromptSpans, TokenSpan


def _rows(span: TokenSpan, value: float) -> dict[int, np.ndarray]:
    return {0: np.full((span.length, 2), value, np.float32), 3: np.full((span.length, 2), value)}


def test_keeps_captured_spans_and_serves_them_to_a_later_prompt() -> None:
    cache = QueryCache(size=2)
    a, b = TokenSpan(0, 2), TokenSpan(4, 7)
    prompt = [5, 6, 7, 8, 9, 10, 11]
    assert cache.missing((a, b), prompt) == [a, b]
    assert cache.keep((a, b), {a: _rows(a, 1.0)}, prompt) == [b]
    assert query_key(a, prompt) in cache
    joined = cache.joined((a, b), {b: _rows(b, 2.0)}, prompt, (TokenSpan(5, 7), a))
    assert joined is not None
    assert joined.positions.tolist() == [0, 1, 4, 5, 6]
    assert joined.lexical is not None  # the lexical spans' tokens, in the prompt's order
    assert joined.lexical.positions.tolist() == [0, 1, 5, 6]
    assert joined.lexical.tokens.tolist() == [5, 6, 10, 11]
    assert sorted(joined.by_layer) == [0, 3]
    assert joined.by_layer[0][:, 0].tolist() == [1.0, 1.0, 2.0, 2.0, 2.0]
    other = [5, 6, 99, 8, 9, 10, 11]  # the same span, the same tokens: the same key
    assert cache.missing((a,), other) == []
    assert cache.missing((a,), [1, 6]) == [a]


def test_a_partly_captured_span_is_not_kept_and_the_oldest_goes_first() -> None:
    cache = QueryCache(size=2)
    prompt = list(range(20))
    spans = [TokenSpan(0, 2), TokenSpan(2, 4), TokenSpan(4, 6)]
    short = {0: np.zeros((1, 2), np.float32)}
    assert cache.keep((spans[0],), {spans[0]: short}, prompt) == [spans[0]]
    for span in spans:
        assert cache.keep((span,), {span: _rows(span, 0.5)}, prompt) == []
    assert cache.missing(spans, prompt) == [spans[0]]
    cache.clear()
    assert cache.missing(spans, prompt) == spans
    assert cache.joined(spans, {}, prompt, spans) is None


def test_null_recurrent_hook_cuts_where_asked() -> None:
    hook = NullRecurrent()
    assert hook.active is False
    assert hook.rewind_to(37) == 37
    assert hook.chunk_size(100, 28) == 28
    assert hook.plan_prefill(0, 500, PromptSpans(), 64, 32) == []
