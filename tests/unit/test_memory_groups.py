"""Image groups in the planner: an image's blocks are held all together or not at all, by
every tier, by retrieval and by the prefill stream window. Exact block sets by hand, the
plain planner unchanged without groups, and a randomized group-aware reference."""

from __future__ import annotations

import math
import random
from dataclasses import replace

from kvmem.memory.planner import (
    PlannerConfig,
    RetrievalMethod,
    Tier,
    WindowRequest,
    block_groups,
    plan_window,
    stream_window,
)
from kvmem.memory.spans import PromptSpans, TokenSpan

RET, REC = RetrievalMethod.RETRIEVAL, RetrievalMethod.RECENCY
BT = 4
IMAGE = TokenSpan(24, 40)  # blocks 6-9
SPANS = PromptSpans(
    control=TokenSpan(0, 11),
    query=TokenSpan(11, 19),
    trajectory=TokenSpan(19, 81),
    live=TokenSpan(70, 81),
    groups=(IMAGE,),
)
SCORES = {b: 0.0 for b in range(20)} | {7: 0.9, 12: 0.8, 13: 0.7}


def _config(budget: int, **kw) -> PlannerConfig:
    args = dict(control_tokens=8, query_tokens=8, trajectory_tokens=8, stream_tokens=8)
    args.update(kw)
    return PlannerConfig(
        block_tokens=BT, budget_tokens=budget, sink_blocks=1, recent_blocks=2, **args
    )


def _plan(budget: int, spans: PromptSpans = SPANS, **kw):
    request = WindowRequest(n_complete=20, open_tokens=1, spans=spans)
    return plan_window(_config(budget, **kw), request, on_gpu=(), scores=SCORES)


PINS = {
    Tier.SINK: (0,),
    Tier.RECENT: (18, 19),
    Tier.CONTROL: (1, 2),
    Tier.QUERY: (3, 4),
    Tier.TRAJECTORY: (16, 17),
}


def test_block_groups_merge_groups_sharing_a_block_and_drop_the_open_block() -> None:
    groups = block_groups([TokenSpan(24, 40), TokenSpan(38, 45), TokenSpan(70, 90)], BT, 20)
    assert groups[6] == groups[11] == (6, 7, 8, 9, 10, 11)
    assert groups[17] == (17, 18, 19)  # blocks 20-22 are not complete
    assert 5 not in groups and 12 not in groups


def test_an_image_too_big_for_the_slots_left_is_dropped_whole() -> None:
    # 11 slots: the pins take 9; the image (4 blocks) does not fit in 2, although its
    # block 7 scores best: retrieval skips the group for blocks 12 and 13
    plan = _plan(48)
    assert plan.tiers == PINS | {Tier.RETRIEVED: (12, 13)}
    assert plan.unpinned[Tier.IMAGE] == (6, 7, 8, 9)
    # the plain planner (no groups) would hold half the image's best block
    plain = _plan(48, replace(SPANS, groups=()))
    assert plain.tiers == PINS | {Tier.RETRIEVED: (7, 12)}


def test_the_latest_image_is_kept_with_the_live_tiers() -> None:
    plan = _plan(60)  # 14 slots: the pins, the image, one retrieved
    assert plan.tiers == PINS | {Tier.IMAGE: (6, 7, 8, 9), Tier.RETRIEVED: (12,)}
    assert plan.selected == (0, 1, 2, 3, 4, 6, 7, 8, 9, 12, 16, 17, 18, 19)


def test_without_the_image_tier_retrieval_takes_the_group_whole_by_its_best_block() -> None:
    plan = _plan(60, keep_latest_image=False)
    assert plan.tiers == PINS | {Tier.RETRIEVED: (6, 7, 8, 9, 12)}


def test_a_tier_takes_a_group_whole_or_stops_before_it() -> None:
    # the trajectory's newest blocks 16-17 hold the image's tail (groups 14-17)
    spans = replace(SPANS, groups=(TokenSpan(56, 72),))
    plan = _plan(60, spans, keep_latest_image=False)
    # recent 18-19; the trajectory (bound 2) meets the 4-block group 14-17 first and stops
    assert plan.tier(Tier.TRAJECTORY) == ()
    assert plan.unpinned[Tier.TRAJECTORY] == tuple(range(5, 18))
    # 7 slots left: by score 7, 12, 13, then the newest unit, the whole group 14-17
    assert plan.tier(Tier.RETRIEVED) == (7, 12, 13, 14, 15, 16, 17)


def test_a_sink_inside_an_image_holds_the_whole_image() -> None:
    spans = PromptSpans(query=TokenSpan(70, 78), groups=(TokenSpan(0, 12),))
    plan = _plan(48, spans)
    assert plan.tier(Tier.SINK) == (0, 1, 2)


def test_stream_window_keeps_or_drops_the_image_whole() -> None:
    spans = PromptSpans(control=TokenSpan(0, 4), groups=(TokenSpan(28, 44),))  # blocks 7-10
    config = _config(48)
    assert stream_window(config, 48, spans, room=20) == (0, 11)
    assert stream_window(config, 48, replace(spans, groups=()), room=20) == (0, 10, 11)
    assert stream_window(config, 48, spans, room=48) == tuple(range(12))  # all fit


# --- randomized comparison with a group-aware plain reference ----------------------------


def _reference(config: PlannerConfig, request: WindowRequest, scores: dict[int, float]):
    n, spans = request.n_complete, request.spans
    slots = max(0, (config.budget_tokens - request.open_tokens) // BT)
    if n <= slots:
        return tuple(range(n))
    group_of: dict[int, list[int]] = {}
    for b in range(n):
        members = {b}
        for g in spans.groups:
            lo, hi = g.start // BT, (g.end - 1) // BT
            if g.length and lo <= b <= hi:
                members |= {x for x in range(lo, hi + 1) if x < n}
        group_of[b] = sorted(members)
    changed = True
    while changed:  # merge groups sharing a block
        changed = False
        for b in range(n):
            merged = sorted({y for x in group_of[b] for y in group_of[x]})
            if merged != group_of[b]:
                group_of[b], changed = merged, True
    chosen: list[int] = []

    def take(newest_first: list[int], bound: int, stop: bool = True) -> None:
        count = 0
        for b in newest_first:
            if b in chosen:
                continue
            unit = [x for x in group_of[b] if x not in chosen]
            if count + len(unit) <= bound and len(chosen) + len(unit) <= slots:
                chosen.extend(unit)
                count += len(unit)
            elif stop:
                return

    def blocks(span):
        if span is None or not span.length:
            return []
        return [b for b in range(span.start // BT, (span.end - 1) // BT + 1) if b < n]

    take(list(range(min(config.sink_blocks, n))), n)
    take(list(range(n - 1, -1, -1))[: config.recent_blocks], n)
    take(list(reversed(blocks(spans.control))), config.control_tokens // BT)
    take(list(reversed(blocks(spans.query))), math.ceil(config.query_tokens / BT))
    take(list(reversed(blocks(spans.trajectory))), math.ceil(config.trajectory_tokens / BT))
    grouped = [
        b
        for b in range(n)
        if len(group_of[b]) > 1
        or any(g.length and g.start // BT <= b <= (g.end - 1) // BT for g in spans.groups)
    ]
    if config.keep_latest_image and grouped:
        take(list(reversed(group_of[max(grouped)])), n)
    take(sorted({b for b in request.forced if b < n}, reverse=True), n)
    rest = [b for b in range(n) if b not in chosen]
    key = (lambda b: -b) if config.method is REC else (lambda b: (-scores[b], -b))
    take(sorted(rest, key=key), n, stop=False)
    return tuple(sorted(chosen))


def _span(rng: random.Random, hi: int) -> TokenSpan | None:
    if rng.random() < 0.2:
        return None
    a = rng.randint(0, hi)
    return TokenSpan(a, rng.randint(a, hi))


def test_random_group_plans_match_reference_and_hold_groups_whole() -> None:
    rng = random.Random(99)
    for _ in range(2000):
        config = PlannerConfig(
            block_tokens=BT,
            budget_tokens=rng.randint(0, 40) * BT,
            sink_blocks=rng.randint(0, 3),
            recent_blocks=rng.randint(0, 4),
            method=rng.choice([RET, REC]),
            control_tokens=rng.randint(0, 20),
            query_tokens=rng.randint(0, 20),
            trajectory_tokens=rng.randint(0, 40),
            keep_latest_image=rng.random() < 0.5,
        )
        n = rng.randint(0, 40)
        groups = tuple(
            sorted(
                (g for _ in range(rng.randint(0, 3)) if (g := _span(rng, n * BT + 3))),
                key=lambda g: g.start,
            )
        )
        spans = PromptSpans(*(_span(rng, n * BT + 3) for _ in range(3)), groups=groups)
        forced = tuple(rng.sample(range(45), rng.randint(0, 3)))
        request = WindowRequest(n, rng.randint(0, 2 * BT), spans, forced)
        scores = {b: float(rng.randint(0, 5)) for b in range(n)}
        plan = plan_window(config, request, set(), scores)
        assert plan.selected == _reference(config, request, scores)
        selected = set(plan.selected)
        for unit in block_groups(groups, BT, n).values():
            assert set(unit) <= selected or not set(unit) & selected
