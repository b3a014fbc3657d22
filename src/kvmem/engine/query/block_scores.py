"""The scores of one plan's candidates: what the window ranks by, computed in the turn or
beside the prefill (query_ahead.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BlockScores:
    """The scores of one plan's candidates for one query."""

    ranked: tuple[int, ...]  # the candidates, as `candidates` ranks them
    # block id -> what ranks it: the estimated attention mass, or (`--kvmem-lexical fuse`)
    # its reciprocal-rank fusion with the BM25 rank
    values: dict[int, float]
    score_ms: float  # the scoring itself
    index_ms: float  # waiting for the block summaries still being computed
    wait_ms: float  # what the turn waited for them: all of it, or the wait for the result
    ahead_at: int = -1  # computed beside the prefill, from this history length; -1: not
