"""Prompt-lookup drafts: propose the next tokens by finding the history's own tail earlier
in the history (agent turns echo tool output, code and earlier text).

`draft_ngram(history, n_draft)` looks for earlier occurrences of the last tokens of
`history`: the match whose tail agrees with the history's tail for the most tokens (at
least `n_min`, counted up to `n_max`) wins, the most recent one among equally long matches;
the draft is the up to `n_draft` tokens that followed it. No match: an empty draft.

This is llama.cpp's `ngram-simple` speculative type (common/ngram-map.cpp: a fixed-size
n-gram, searched backwards) widened to the longest match in [n_min, n_max]. The search is
one vectorised pass over the positions holding the last token, so a 100K-token history
costs well under a millisecond per step. Pure numpy; the engine verifies the draft.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

SPEC_TYPE = "ngram-simple"  # llama.cpp's --spec-type name for prompt lookup


@dataclass(frozen=True, slots=True)
class NgramDraftParams:
    n_draft: int = 3  # draft tokens at most (llama.cpp --spec-draft-n-max)
    n_min: int = 2  # shortest tail match that counts
    n_max: int = 8  # longer matches are ranked as equal to n_max
    window: int = 0  # search only the last `window` tokens (0: the whole history)

    def __post_init__(self) -> None:
        if self.n_draft < 1:
            raise ValueError(f"n_draft must be >= 1, got {self.n_draft}")
        if not 1 <= self.n_min <= self.n_max:
            raise ValueError(f"need 1 <= n_min <= n_max, got {self.n_min}, {self.n_max}")
        if self.window < 0:
            raise ValueError(f"window must be >= 0, got {self.window}")


def draft_ngram(
    history: Sequence[int] | np.ndarray, params: NgramDraftParams = NgramDraftParams()
) -> list[int]:
    """Up to `params.n_draft` tokens that followed the longest, most recent earlier match
    of the history's tail; [] when nothing matches at least `params.n_min` tokens."""
    h = np.asarray(history, dtype=np.int64)  # [n_tokens]
    if params.window and len(h) > params.window:
        h = h[-params.window :]
    n = len(h)
    if n < params.n_min + 1:
        return []
    # candidate match ends e < n - 1 (at least one token follows) holding the last token
    ends = np.flatnonzero(h[: n - 1] == h[n - 1])  # [n_cand]
    ends = ends[ends >= params.n_min - 1]
    if ends.size == 0:
        return []
    length = np.ones(ends.size, dtype=np.int64)  # [n_cand]: agreeing tail tokens so far
    alive = np.ones(ends.size, dtype=bool)  # [n_cand]: still agreeing
    for i in range(1, params.n_max):
        idx = ends - i  # [n_cand]
        ok = alive & (idx >= 0)
        ok[ok] = h[idx[ok]] == h[n - 1 - i]
        alive = ok
        if not alive.any():
            break
        length += alive
    best = int(length.max())
    if best < params.n_min:
        return []
    end = int(ends[length == best].max())  # the most recent of the longest matches
    return [int(t) for t in h[end + 1 : end + 1 + params.n_draft]]
