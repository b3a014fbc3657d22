"""The GPU working set: which complete blocks to hold, and which to evict under pressure.

`plan_window` picks the window for a query and diffs it against what is resident, so
that blocks that stay are not touched. `plan_eviction` picks the blocks to move out when
a long prefill or a generation needs room. Both are pure functions of their arguments.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from kvmem.errors import MemoryLayoutError


class RetrievalMethod(Enum):
    """How the budget beyond sink and recent blocks is filled."""

    RETRIEVAL = "retrieval"  # highest scores first
    RECENCY = "recency"  # the next most recent blocks (a baseline)


@dataclass(frozen=True, slots=True)
class PlannerConfig:
    block_tokens: int
    budget_tokens: int  # GPU KV tokens for the selected working set
    sink_blocks: int  # first blocks always kept
    recent_blocks: int  # most recent complete blocks always kept
    method: RetrievalMethod

    def __post_init__(self) -> None:
        if self.block_tokens <= 0 or self.budget_tokens < 0:
            raise MemoryLayoutError(f"invalid planner sizes {self}")
        if self.sink_blocks < 0 or self.recent_blocks < 0:
            raise MemoryLayoutError(f"invalid sink/recent block counts {self}")


@dataclass(frozen=True, slots=True)
class WindowPlan:
    """A chosen window and its diff against the blocks resident now (all ascending)."""

    selected: tuple[int, ...]  # the window: every block to hold
    sink: tuple[int, ...]  # the protected first blocks
    recent: tuple[int, ...]  # the protected last blocks (RECENCY: every non-sink block chosen)
    retrieved: tuple[int, ...]  # chosen by score (empty when everything fits)
    keep: tuple[int, ...]  # selected and resident: untouched
    stage_in: tuple[int, ...]  # selected, not resident: copy in from the host
    stage_out: tuple[int, ...]  # resident, not selected: remove from the GPU

    @property
    def changed(self) -> bool:
        return bool(self.stage_in or self.stage_out)


def window_slots(config: PlannerConfig, tail_tokens: int) -> int:
    """Complete blocks that fit in the budget next to `tail_tokens` other GPU tokens."""
    return max(0, (config.budget_tokens - tail_tokens) // config.block_tokens)


def plan_window(
    config: PlannerConfig,
    candidates: Sequence[int],
    on_gpu: Collection[int],
    scores: Mapping[int, float] | None,
    tail_tokens: int,
) -> WindowPlan:
    """Choose the window among `candidates` (complete block ids, ascending).

    All fit: all are selected. Otherwise the first `sink_blocks` and the last
    `recent_blocks` candidates (sink first, then as many recent as fit), then the
    remaining slots by score (ties: the more recent block; ids missing from `scores`
    rank last) or, for RECENCY, by recency. `scores` may be None for RECENCY or when
    everything fits. Resident ids that are not candidates any more go to stage_out.
    """
    cands = _ascending(candidates)
    split = _split(config, cands, tail_tokens)
    if split is None:  # everything fits
        sink = cands[: min(config.sink_blocks, len(cands))]
        recent = tuple(b for b in cands[len(cands) - config.recent_blocks :] if b not in sink)
        return _diff(cands, sink, recent, (), on_gpu)
    sink, middle, recent, free = split.sink, split.middle, split.recent, split.free
    if free == 0 or not middle:
        return _diff(sink + recent, sink, recent, (), on_gpu)
    if config.method is RetrievalMethod.RECENCY:
        extra = middle[len(middle) - free :] if free < len(middle) else middle
        return _diff(sink + extra + recent, sink, extra + recent, (), on_gpu)
    if scores is None:
        raise MemoryLayoutError("the retrieval method needs block scores when not everything fits")
    ranked = sorted(middle, key=lambda b: (-_score(scores, b), -b))
    retrieved = tuple(sorted(ranked[:free]))
    return _diff(sink + retrieved + recent, sink, recent, retrieved, on_gpu)


def scored_candidates(
    config: PlannerConfig, candidates: Sequence[int], tail_tokens: int
) -> tuple[int, ...]:
    """The candidates `plan_window` ranks by score: the middle blocks (not sink, not
    recent) when some do not fit and slots remain for them; empty otherwise, and for
    RECENCY. Scores for other blocks are never read, so only these need scoring."""
    if config.method is RetrievalMethod.RECENCY:
        return ()
    split = _split(config, _ascending(candidates), tail_tokens)
    if split is None or split.free == 0:
        return ()
    return split.middle


@dataclass(frozen=True, slots=True)
class _Split:
    sink: tuple[int, ...]
    middle: tuple[int, ...]
    recent: tuple[int, ...]
    free: int  # slots left for middle blocks


def _split(config: PlannerConfig, cands: tuple[int, ...], tail_tokens: int) -> _Split | None:
    """Sink / middle / recent of candidates that do not all fit (None when they do)."""
    slots = window_slots(config, tail_tokens)
    if len(cands) <= slots:
        return None
    sink = cands[: min(config.sink_blocks, len(cands), slots)]
    n_recent = min(config.recent_blocks, slots - len(sink))
    recent = cands[len(cands) - n_recent :] if n_recent else ()
    middle = cands[len(sink) : len(cands) - len(recent)]
    return _Split(sink, middle, recent, slots - len(sink) - len(recent))


def plan_eviction(
    config: PlannerConfig,
    on_gpu: Sequence[int],
    candidates: Sequence[int],
    preferred: Collection[int],
    n_blocks: int,
) -> tuple[int, ...]:
    """Up to `n_blocks` resident complete blocks to move off the GPU, in eviction order.

    Order: unprotected blocks not in `preferred` (the current selection), oldest first;
    unprotected preferred ones, oldest first; then the `recent_blocks` most recent
    candidates, oldest first; the sink blocks only as the very last resort. Resident ids
    that are not candidates (the open tail block) are never chosen.
    """
    cands = _ascending(candidates)
    if n_blocks <= 0:
        return ()
    sink = set(cands[: config.sink_blocks])
    recent = set(cands[len(cands) - config.recent_blocks :] if config.recent_blocks else ()) - sink
    candidate_set = set(cands)
    resident = sorted(set(on_gpu) & candidate_set)
    order = (
        [b for b in resident if b not in sink and b not in recent and b not in preferred]
        + [b for b in resident if b not in sink and b not in recent and b in preferred]
        + [b for b in resident if b in recent]
        + [b for b in resident if b in sink]
    )
    return tuple(order[:n_blocks])


def _ascending(ids: Sequence[int]) -> tuple[int, ...]:
    out = tuple(int(b) for b in ids)
    if any(a >= b for a, b in zip(out, out[1:], strict=False)):
        raise MemoryLayoutError("candidate block ids must be strictly ascending")
    return out


def _score(scores: Mapping[int, float], block_id: int) -> float:
    value = float(scores.get(block_id, -math.inf))
    return -math.inf if math.isnan(value) else value


def _diff(
    selected: Sequence[int],
    sink: Sequence[int],
    recent: Sequence[int],
    retrieved: Sequence[int],
    on_gpu: Collection[int],
) -> WindowPlan:
    chosen = tuple(sorted(selected))
    chosen_set = set(chosen)
    resident = set(on_gpu)
    return WindowPlan(
        selected=chosen,
        sink=tuple(sorted(sink)),
        recent=tuple(sorted(recent)),
        retrieved=tuple(sorted(retrieved)),
        keep=tuple(b for b in chosen if b in resident),
        stage_in=tuple(b for b in chosen if b not in resident),
        stage_out=tuple(sorted(resident - chosen_set)),
    )
