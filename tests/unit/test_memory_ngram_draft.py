"""Prompt-lookup drafts against a plain reference implementation."""

from __future__ import annotations

import numpy as np
import pytest

from kvmem.memory.ngram_draft import SPEC_TYPE, NgramDraftParams, draft_ngram


def reference_draft(history: list[int], params: NgramDraftParams) -> list[int]:
    """Longest tail match first (capped at n_max), most recent first, by plain loops."""
    h = history[-params.window :] if params.window else list(history)
    n = len(h)
    best_len, best_end = 0, -1
    for end in range(n - 2, -1, -1):  # most recent first
        length = 0
        while length < params.n_max and end - length >= 0 and h[end - length] == h[n - 1 - length]:
            length += 1
        if length > best_len:
            best_len, best_end = length, end
    if best_len < params.n_min:
        return []
    return h[best_end + 1 : best_end + 1 + params.n_draft]


def test_spec_type_is_llama_cpp_name() -> None:
    assert SPEC_TYPE == "ngram-simple"


def test_simple_cases() -> None:
    p = NgramDraftParams(n_draft=3, n_min=2, n_max=4)
    # "5 6 7 8 9" seen before; the tail "... 5 6" drafts "7 8 9"
    assert draft_ngram([1, 5, 6, 7, 8, 9, 2, 5, 6], p) == [7, 8, 9]
    # the longer match wins over the more recent shorter one
    h = [3, 5, 6, 10, 11, 12, 9, 9, 4, 5, 6, 20, 21, 3, 5, 6]
    assert draft_ngram(h, p) == [10, 11, 12]
    # two equally long matches: the most recent
    assert draft_ngram([5, 6, 1, 2, 5, 6, 3, 4, 5, 6], p) == [3, 4, 5]
    # a match near the end drafts fewer tokens (what followed it, up to the present)
    assert draft_ngram([8, 8, 8], p) == [8]
    assert draft_ngram([1, 2, 3, 4], p) == []  # no repeat
    assert draft_ngram([1, 2, 9, 2], p) == []  # a 1-token match is below n_min
    assert draft_ngram([1, 2, 9, 2], NgramDraftParams(n_min=1)) == [9, 2]
    assert draft_ngram([], p) == [] and draft_ngram([7], p) == []
    assert draft_ngram(np.array([1, 5, 6, 7, 2, 5, 6], dtype=np.int32), p) == [7, 2, 5]


def test_window_limits_the_search_to_recent_tokens() -> None:
    h = [5, 6, 7, 8] + [0] * 20 + [5, 6]
    assert draft_ngram(h, NgramDraftParams(n_min=2)) == [7, 8, 0]
    assert draft_ngram(h, NgramDraftParams(n_min=2, window=10)) == []


@pytest.mark.parametrize("seed", range(40))
def test_matches_reference_on_random_histories(seed: int) -> None:
    rng = np.random.default_rng(seed)
    vocab = int(rng.integers(2, 6))
    history = rng.integers(0, vocab, int(rng.integers(0, 80))).tolist()
    for params in (
        NgramDraftParams(n_draft=3, n_min=1, n_max=3),
        NgramDraftParams(n_draft=5, n_min=2, n_max=6),
        NgramDraftParams(n_draft=8, n_min=3, n_max=12, window=int(rng.integers(1, 60))),
    ):
        assert draft_ngram(history, params) == reference_draft(history, params), params


def test_invalid_params() -> None:
    for kwargs in (dict(n_draft=0), dict(n_min=0), dict(n_min=5, n_max=4), dict(window=-1)):
        with pytest.raises(ValueError):
            NgramDraftParams(**kwargs)
