"""The GPU working set as tiers: which complete blocks to hold for a query (pure policy).

The budget is filled in tier order, each tier bounded:

1. ``sink``: the first `sink_blocks` blocks;
2. ``recent``: the last `recent_blocks` complete blocks;
   ``pinned``: an agent harness's control text and reminders (`PromptSpans.pinned`), all
   of it (the server answers 413 when it cannot fit);
3. ``control``: the control text (system prompt, tool definitions), its newest
   `control_tokens`;
4. ``query``: the task (the last user message), its newest `query_tokens`;
5. ``trajectory``: the live trajectory after the task (assistant tool calls, tool
   results), its newest `trajectory_tokens`;
6. ``image``: the latest image's blocks (`keep_latest_image`);
7. ``forced``: blocks a caller forces in (the oracle diagnostic);
8. ``retrieved``: every slot left, by score (or by recency for the baseline); with
   `neighbor_blocks` N, each ranked block brings the candidates up to N blocks on either
   side of it right after itself (the nearest first, the later one before the earlier).

A tier that does not fit keeps its newest blocks; the rest are `unpinned` (they stay
retrieval candidates) and the window traces them. When every block fits, all are held.
An image's blocks (a group, `PromptSpans.groups`) are one unit everywhere: a tier takes
a group whole or stops before it, and retrieval takes it whole, ranked by its best block,
or skips it for smaller units.
`plan_window` is a pure function of its arguments, and `stream_window` gives the window a
prefill chunk sees, as a function of its position alone.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum

from kvmem.errors import MemoryLayoutError
from kvmem.memory.spans import PromptSpans, TokenSpan


class RetrievalMethod(Enum):
    """How the slots beyond the pinned tiers are filled."""

    RETRIEVAL = "retrieval"  # highest scores first
    RECENCY = "recency"  # the next most recent blocks (a baseline)


class Tier(Enum):
    SINK = "sink"
    RECENT = "recent"
    PINNED = "pinned"
    CONTROL = "control"
    QUERY = "query"
    TRAJECTORY = "trajectory"
    IMAGE = "image"
    FORCED = "forced"
    RETRIEVED = "retrieved"


@dataclass(frozen=True, slots=True)
class PlannerConfig:
    block_tokens: int
    budget_tokens: int  # GPU KV tokens for the selected working set
    sink_blocks: int  # first blocks always kept
    recent_blocks: int  # most recent complete blocks always kept
    method: RetrievalMethod = RetrievalMethod.RETRIEVAL
    control_tokens: int = 0  # bound of the control tier
    query_tokens: int = 0  # bound of the query tier
    trajectory_tokens: int = 0  # bound of the trajectory tier
    stream_tokens: int = 0  # newest tokens a prefill chunk sees (besides sink and control)
    keep_latest_image: bool = True  # the image tier: the latest image group is pinned
    neighbor_blocks: int = 0  # candidates on either side a retrieved block brings along

    def __post_init__(self) -> None:
        if self.block_tokens <= 0 or self.budget_tokens < 0:
            raise MemoryLayoutError(f"invalid planner sizes {self}")
        if self.sink_blocks < 0 or self.recent_blocks < 0:
            raise MemoryLayoutError(f"invalid sink/recent block counts {self}")
        if (
            min(self.control_tokens, self.query_tokens, self.trajectory_tokens, self.stream_tokens)
            < 0
        ):
            raise MemoryLayoutError(f"invalid tier bounds {self}")
        if self.neighbor_blocks < 0:
            raise MemoryLayoutError(f"invalid neighbour count {self}")

    @property
    def stream_blocks(self) -> int:
        """Newest blocks a prefill chunk sees besides the sink and control tiers."""
        return max(math.ceil(self.stream_tokens / self.block_tokens), self.recent_blocks)


@dataclass(frozen=True, slots=True)
class WindowRequest:
    """What the window is planned for."""

    n_complete: int  # complete blocks of the history: candidates 0 .. n_complete - 1
    open_tokens: int  # tokens of the open tail block, on the GPU outside the plan
    spans: PromptSpans = field(default_factory=PromptSpans)
    forced: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class WindowPlan:
    """A chosen window by tier, and its diff against the blocks resident now (ascending)."""

    selected: tuple[int, ...]  # the window: every block to hold
    tiers: Mapping[Tier, tuple[int, ...]]  # the blocks each tier holds
    unpinned: Mapping[Tier, tuple[int, ...]]  # a tier's blocks past its bound or the budget
    keep: tuple[int, ...]  # selected and resident: untouched
    stage_in: tuple[int, ...]  # selected, not resident: copy in from the host
    evict: tuple[int, ...]  # resident, not selected: remove from the GPU
    fits: bool = False  # every candidate fits: nothing was ranked

    def tier(self, tier: Tier) -> tuple[int, ...]:
        return self.tiers.get(tier, ())

    @property
    def sink(self) -> tuple[int, ...]:
        return self.tier(Tier.SINK)

    @property
    def recent(self) -> tuple[int, ...]:
        return self.tier(Tier.RECENT)

    @property
    def retrieved(self) -> tuple[int, ...]:
        return self.tier(Tier.RETRIEVED)


@dataclass(frozen=True, slots=True)
class _Pins:
    tiers: dict[Tier, tuple[int, ...]]
    unpinned: dict[Tier, tuple[int, ...]]
    middle: tuple[int, ...]  # candidates no tier holds, ascending
    free: int  # slots left for them


def window_slots(config: PlannerConfig, open_tokens: int) -> int:
    """Complete blocks that fit in the budget next to `open_tokens` other GPU tokens."""
    return max(0, (config.budget_tokens - open_tokens) // config.block_tokens)


def plan_window(
    config: PlannerConfig,
    request: WindowRequest,
    on_gpu: Collection[int],
    scores: Mapping[int, float] | None,
) -> WindowPlan:
    """Choose the window for `request` and diff it against the resident `on_gpu` blocks.

    Retrieved slots go to the highest `scores` (ties: the more recent block; ids missing
    from `scores` rank last). Without scores, and for RECENCY, they go to the newest
    blocks no tier holds.
    """
    n = request.n_complete
    pins = _pins(config, request)
    if n <= window_slots(config, request.open_tokens):
        return _diff(range(n), pins.tiers, {}, on_gpu, fits=True)
    ranked = _rank(config, pins.middle, scores)
    tiers = dict(pins.tiers)
    if pins.free and ranked:
        groups = block_groups(request.spans.groups, config.block_tokens, n)
        tiers[Tier.RETRIEVED] = tuple(sorted(_fill(ranked, pins.free, groups)))
    chosen = [b for blocks in tiers.values() for b in blocks]
    return _diff(chosen, tiers, pins.unpinned, on_gpu, fits=False)


def ranked_candidates(config: PlannerConfig, request: WindowRequest) -> tuple[int, ...]:
    """The blocks `plan_window` ranks by score: empty when everything fits, when no slot
    is left, and for RECENCY. Scores of other blocks are never read."""
    if config.method is RetrievalMethod.RECENCY:
        return ()
    if request.n_complete <= window_slots(config, request.open_tokens):
        return ()
    pins = _pins(config, request)
    return pins.middle if pins.free else ()


def stream_window(
    config: PlannerConfig, position: int, spans: PromptSpans, room: int
) -> tuple[int, ...]:
    """The complete blocks a prefill chunk starting at `position` (block-aligned) sees.

    Every block before it when all fit in `room` tokens; otherwise the sink, the block
    right before the chunk, the control tier and the newest `stream_blocks`, as many as
    fit. The chunk continues that block's text, and llama.cpp decodes a batch only right
    after the sequence's last cell: a control tier as large as the room (64-token blocks:
    a 256-token room, a 256-token control bound) must not push it out. A function of the
    position and the control span alone, so that the KV of every block depends on the
    tokens only.
    """
    bt = config.block_tokens
    if position % bt:
        raise MemoryLayoutError(f"prefill chunk at {position} is not block-aligned")
    n = position // bt
    slots = max(0, room // bt)
    if n <= slots:
        return tuple(range(n))
    control = spans.control.clip(position) if spans.control else None
    taker = _Taker(slots, block_groups(spans.groups, bt, n), unpinned=False)  # O(window)
    taker.take(Tier.SINK, range(min(config.sink_blocks, n)), n)  # an image there: whole
    held = len(taker.taken)
    last_unit = taker.groups.get(n - 1, (n - 1,))  # the block before the chunk, or its image
    taker.take(Tier.RECENT, (n - 1,), len(last_unit))
    adjacent = len(taker.taken) - held
    taker.take(Tier.CONTROL, _newest(control, bt, n), config.control_tokens // bt)
    taker.take(Tier.RECENT, range(n - 1, -1, -1), config.stream_blocks - adjacent)
    return tuple(sorted(taker.taken))


def block_groups(
    groups: Iterable[TokenSpan], block_tokens: int, n_complete: int
) -> dict[int, tuple[int, ...]]:
    """Complete block -> every complete block of its group (groups sharing a block merge)."""
    ranges: list[list[int]] = []
    for span in sorted(groups, key=lambda g: g.start):
        blocks = [b for b in span.blocks(block_tokens) if b < n_complete]
        if not blocks:
            continue
        if ranges and blocks[0] <= ranges[-1][1]:
            ranges[-1][1] = max(ranges[-1][1], blocks[-1])
        else:
            ranges.append([blocks[0], blocks[-1]])
    out: dict[int, tuple[int, ...]] = {}
    for lo, hi in ranges:
        unit = tuple(range(lo, hi + 1))
        out.update((b, unit) for b in unit)
    return out


def _units(
    blocks: Iterable[int], groups: Mapping[int, tuple[int, ...]], taken: Collection[int]
) -> Iterable[list[int]]:
    """The blocks in order, each with the rest of its group: units never taken twice."""
    seen: set[int] = set()
    for b in blocks:
        if b in taken or b in seen:
            continue
        unit = [x for x in groups.get(b, (b,)) if x not in taken]
        seen.update(unit)
        yield unit


def _fill(ranked: list[int], free: int, groups: Mapping[int, tuple[int, ...]]) -> list[int]:
    """The best-ranked units that fit in `free` slots (a group that does not is skipped)."""
    out: list[int] = []
    for unit in _units(ranked, groups, ()):
        if len(unit) <= free - len(out):
            out += unit
    return out


class _Taker:
    """Fills slots tier by tier, newest blocks first within a tier; a group is one unit."""

    def __init__(
        self,
        slots: int,
        groups: Mapping[int, tuple[int, ...]] | None = None,
        *,
        unpinned: bool = True,
    ) -> None:
        self.free = slots
        self.groups = groups or {}
        self.track_unpinned = unpinned  # else a tier's walk ends at its first unit left out
        self.taken: set[int] = set()
        self.tiers: dict[Tier, tuple[int, ...]] = {}
        self.unpinned: dict[Tier, tuple[int, ...]] = {}

    def take(self, tier: Tier, newest_first: Iterable[int], bound: int) -> None:
        n = max(0, min(bound, self.free))
        kept: list[int] = []
        left: list[int] = []
        for unit in _units(newest_first, self.groups, self.taken):
            if left or len(kept) + len(unit) > n:
                if not self.track_unpinned:
                    break
                left += unit  # the first unit that does not fit ends the tier
            else:
                kept += unit
        self.taken.update(kept)
        self.free -= len(kept)
        if kept:
            self.tiers[tier] = tuple(sorted(kept))
        if left:
            self.unpinned[tier] = tuple(sorted(left))


def _pins(config: PlannerConfig, request: WindowRequest) -> _Pins:
    bt, n, spans = config.block_tokens, request.n_complete, request.spans
    groups = block_groups(spans.groups, bt, n)
    taker = _Taker(window_slots(config, request.open_tokens), groups)
    taker.take(Tier.SINK, range(min(config.sink_blocks, n)), n)  # an image there: whole
    taker.take(Tier.RECENT, range(n - 1, max(-1, n - 1 - config.recent_blocks), -1), n)
    taker.take(Tier.PINNED, pinned_blocks(spans.pinned, bt, n), n)
    taker.take(Tier.CONTROL, _newest(spans.control, bt, n), config.control_tokens // bt)
    taker.take(Tier.QUERY, _newest(spans.query, bt, n), _bound(config.query_tokens, bt))
    traj = _newest(spans.trajectory, bt, n)
    taker.take(Tier.TRAJECTORY, traj, _bound(config.trajectory_tokens, bt))
    if config.keep_latest_image and groups:
        latest = groups[max(groups)]
        taker.take(Tier.IMAGE, reversed(latest), len(latest))
    forced = sorted({b for b in request.forced if 0 <= b < n}, reverse=True)
    taker.take(Tier.FORCED, forced, n)
    middle = tuple(b for b in range(n) if b not in taker.taken)
    return _Pins(taker.tiers, taker.unpinned, middle, taker.free)


def pinned_blocks(spans: Iterable[TokenSpan], block_tokens: int, n_complete: int) -> list[int]:
    """The complete blocks holding any pinned token, newest first."""
    blocks = {b for s in spans for b in s.blocks(block_tokens) if b < n_complete}
    return sorted(blocks, reverse=True)


def _bound(tokens: int, block_tokens: int) -> int:
    """Blocks a tier of `tokens` may hold: its newest tokens span at most this many."""
    return math.ceil(tokens / block_tokens) if tokens else 0


def _newest(span: TokenSpan | None, block_tokens: int, n_complete: int) -> list[int]:
    """Complete blocks of `span`, newest first."""
    if span is None:
        return []
    return [b for b in reversed(span.blocks(block_tokens)) if b < n_complete]


def _rank(
    config: PlannerConfig, middle: tuple[int, ...], scores: Mapping[int, float] | None
) -> list[int]:
    if config.method is RetrievalMethod.RECENCY or scores is None:
        return sorted(middle, reverse=True)
    by_score = sorted(middle, key=lambda b: (-_score(scores, b), -b))
    return with_neighbors(by_score, config.neighbor_blocks)


def with_neighbors(ranked: list[int], reach: int) -> list[int]:
    """`ranked` with each block followed by the candidates within `reach` blocks of it
    (b + 1, b - 1, b + 2, ...) not placed yet: a permutation of `ranked`."""
    if reach == 0:
        return ranked
    left = set(ranked)
    out: list[int] = []
    for b in ranked:
        near = (b + d * side for d in range(1, reach + 1) for side in (1, -1))
        for x in (b, *near):
            if x in left:
                left.discard(x)
                out.append(x)
    return out


def _score(scores: Mapping[int, float], block_id: int) -> float:
    value = float(scores.get(block_id, -math.inf))
    return -math.inf if math.isnan(value) else value


def _diff(
    selected: Iterable[int],
    tiers: Mapping[Tier, tuple[int, ...]],
    unpinned: Mapping[Tier, tuple[int, ...]],
    on_gpu: Collection[int],
    *,
    fits: bool,
) -> WindowPlan:
    chosen = tuple(sorted(set(selected)))
    chosen_set, resident = set(chosen), set(on_gpu)
    return WindowPlan(
        selected=chosen,
        tiers={t: tiers[t] for t in Tier if t in tiers},
        unpinned={t: unpinned[t] for t in Tier if t in unpinned},
        keep=tuple(b for b in chosen if b in resident),
        stage_in=tuple(b for b in chosen if b not in resident),
        evict=tuple(sorted(resident - chosen_set)),
        fits=fits,
    )
