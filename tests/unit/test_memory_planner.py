"""The tier planner: exact block ids per tier by hand, and against a plain reference."""

from __future__ import annotations

import math
import random

import pytest

from kvmem.errors import MemoryLayoutError
from kvmem.memory.planner import (
    PlannerConfig,
    RetrievalMethod,
    Tier,
    WindowRequest,
    plan_window,
    ranked_candidates,
    stream_window,
)
from kvmem.memory.spans import PromptSpans, TokenSpan

RET, REC = RetrievalMethod.RETRIEVAL, RetrievalMethod.RECENCY
BT = 4


def _config(budget: int = 48, method: RetrievalMethod = RET, **bounds: int) -> PlannerConfig:
    args = {"control_tokens": 8, "query_tokens": 8, "trajectory_tokens": 8, "stream_tokens": 8}
    args.update(bounds)
    return PlannerConfig(
        block_tokens=BT, budget_tokens=budget, sink_blocks=1, recent_blocks=2, method=method, **args
    )


# an agent loop: control text in blocks 0-2, the task in 3-4, the trajectory from 5 on
AGENT = PromptSpans(
    control=TokenSpan(0, 11),
    query=TokenSpan(11, 19),
    trajectory=TokenSpan(19, 81),
    live=TokenSpan(70, 81),
)


def test_everything_fits_holds_every_block_and_reports_the_tiers() -> None:
    request = WindowRequest(n_complete=6, open_tokens=1, spans=AGENT)
    plan = plan_window(_config(), request, on_gpu=[0, 1, 2, 3], scores=None)
    assert plan.fits
    assert plan.selected == (0, 1, 2, 3, 4, 5)
    assert plan.stage_in == (4, 5) and plan.keep == (0, 1, 2, 3) and plan.evict == ()
    assert plan.tier(Tier.SINK) == (0,) and plan.tier(Tier.RECENT) == (4, 5)
    assert plan.tier(Tier.CONTROL) == (1, 2) and plan.tier(Tier.QUERY) == (3,)
    assert plan.retrieved == ()


def test_agent_loop_tiers_then_retrieval_by_score() -> None:
    # 20 complete blocks, 11 slots next to the open token: sink 0, recent 18-19, control 1-2
    # (bound 2), query 3-4, trajectory 16-17 (its newest 2 beyond recent), 2 slots by score
    request = WindowRequest(n_complete=20, open_tokens=1, spans=AGENT)
    scores = {b: 0.0 for b in range(20)} | {7: 0.9, 12: 0.8, 9: 0.7, 10: 0.1}
    assert ranked_candidates(_config(), request) == (5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
    plan = plan_window(_config(), request, on_gpu=[0, 1, 2, 19, 10], scores=scores)
    assert plan.tiers == {
        Tier.SINK: (0,),
        Tier.RECENT: (18, 19),
        Tier.CONTROL: (1, 2),
        Tier.QUERY: (3, 4),
        Tier.TRAJECTORY: (16, 17),
        Tier.RETRIEVED: (7, 12),
    }
    assert plan.unpinned == {Tier.TRAJECTORY: tuple(range(5, 16))}
    assert plan.selected == (0, 1, 2, 3, 4, 7, 12, 16, 17, 18, 19)
    assert plan.keep == (0, 1, 2, 19) and plan.evict == (10,)
    assert plan.stage_in == (3, 4, 7, 12, 16, 17, 18)


@pytest.mark.parametrize(
    ("reach", "retrieved"), [(0, (7, 9, 10, 12, 15)), (1, (6, 7, 8, 12, 13)), (2, (5, 6, 7, 8, 9))]
)
def test_neighbor_blocks_follow_each_retrieved_block(reach: int, retrieved: tuple) -> None:
    # the loop above with 14 slots: 5 by score, and 7's neighbours (8, then 6) before 12
    request = WindowRequest(n_complete=20, open_tokens=1, spans=AGENT)
    scores = {b: 0.0 for b in range(20)} | {7: 0.9, 12: 0.8, 9: 0.7, 10: 0.1}
    plan = plan_window(_config(60, neighbor_blocks=reach), request, on_gpu=[], scores=scores)
    assert plan.retrieved == retrieved
    assert plan.selected == tuple(sorted((0, 1, 2, 3, 4, 16, 17, 18, 19, *retrieved)))


def test_neighbors_skip_pinned_blocks_and_recency_ignores_them() -> None:
    request = WindowRequest(n_complete=20, open_tokens=1, spans=AGENT)
    scores = {b: 0.0 for b in range(20)} | {15: 0.9, 5: 0.8}  # 16 is the trajectory's
    plan = plan_window(_config(52, neighbor_blocks=1), request, on_gpu=[], scores=scores)
    assert plan.retrieved == (5, 14, 15)  # 15 brings 14 (16 is pinned), then 5
    plan = plan_window(_config(52, REC, neighbor_blocks=1), request, on_gpu=[], scores=scores)
    assert plan.retrieved == (13, 14, 15)
    with pytest.raises(MemoryLayoutError):
        _config(neighbor_blocks=-1)


def test_control_text_longer_than_its_bound_keeps_its_newest_blocks() -> None:
    spans = PromptSpans(control=TokenSpan(0, 30), query=TokenSpan(30, 34))
    request = WindowRequest(n_complete=20, open_tokens=0, spans=spans)
    plan = plan_window(_config(), request, on_gpu=(), scores=None)
    # block 0 is the sink; the bound (8 tokens = 2 blocks) keeps control blocks 6-7
    assert plan.tier(Tier.CONTROL) == (6, 7)
    assert plan.unpinned[Tier.CONTROL] == (1, 2, 3, 4, 5)
    assert plan.tier(Tier.QUERY) == (8,)  # its block 7 is control's already
    # no scores: the free slots go to the newest unpinned blocks
    assert plan.retrieved == (12, 13, 14, 15, 16, 17)


def test_trajectory_longer_than_the_budget_falls_back_to_its_newest_part() -> None:
    spans = PromptSpans(
        control=TokenSpan(0, 8), query=TokenSpan(8, 12), trajectory=TokenSpan(12, 200)
    )
    config = _config(budget=24, trajectory_tokens=400)  # 6 slots, trajectory bound past them
    request = WindowRequest(n_complete=50, open_tokens=0, spans=spans)
    plan = plan_window(config, request, on_gpu=(), scores={b: 1.0 for b in range(50)})
    assert plan.tiers == {
        Tier.SINK: (0,),
        Tier.RECENT: (48, 49),
        Tier.CONTROL: (1,),
        Tier.QUERY: (2,),
        Tier.TRAJECTORY: (47,),
    }
    assert plan.unpinned[Tier.TRAJECTORY] == tuple(range(3, 47))
    assert plan.retrieved == ()
    assert ranked_candidates(config, request) == ()  # no slot left: nothing is scored


def test_budget_smaller_than_the_pins_keeps_sink_and_recent_first() -> None:
    request = WindowRequest(n_complete=10, open_tokens=3, spans=AGENT)
    plan = plan_window(_config(budget=12), request, on_gpu=(), scores=None)
    assert plan.tiers == {Tier.SINK: (0,), Tier.RECENT: (9,)}
    assert plan.unpinned == {
        Tier.RECENT: (8,),
        Tier.CONTROL: (1, 2),
        Tier.QUERY: (2, 3, 4),  # block 2 holds control text and the task
        Tier.TRAJECTORY: (4, 5, 6, 7, 8),
    }


def test_forced_blocks_are_held_and_recency_fills_the_rest() -> None:
    request = WindowRequest(n_complete=20, open_tokens=0, forced=(6, 25))
    plan = plan_window(_config(budget=28, method=REC), request, on_gpu=(), scores=None)
    assert plan.tier(Tier.FORCED) == (6,)
    assert plan.retrieved == (15, 16, 17)
    assert plan.selected == (0, 6, 15, 16, 17, 18, 19)


def test_score_ties_prefer_the_more_recent_block_and_missing_scores_rank_last() -> None:
    request = WindowRequest(n_complete=12, open_tokens=0)
    plan = plan_window(_config(budget=24), request, on_gpu=(), scores={3: 1.0, 5: 1.0, 2: 0.5})
    assert plan.retrieved == (2, 3, 5)
    assert plan.selected == (0, 2, 3, 5, 10, 11)


def test_stream_window_is_a_function_of_the_position() -> None:
    config = _config(stream_tokens=12)
    spans = PromptSpans(control=TokenSpan(0, 10))
    assert stream_window(config, 16, spans, room=20) == (0, 1, 2, 3)  # all fit
    # 10 blocks before position 40: sink, control 1-2 (bound 2 blocks), newest 3
    assert stream_window(config, 40, spans, room=28) == (0, 1, 2, 7, 8, 9)
    assert stream_window(config, 40, spans, room=16) == (0, 1, 2, 9)
    with pytest.raises(MemoryLayoutError):
        stream_window(config, 41, spans, room=28)


def test_the_block_before_the_chunk_stays_when_the_control_tier_fills_the_room() -> None:
    """Issue 33: 64-token blocks leave a four-block room (sink + control bound); the chunk
    still sees the block it continues (llama.cpp decodes only after the last cell)."""
    config = _config(control_tokens=12, stream_tokens=8)
    spans = PromptSpans(control=TokenSpan(4, 20))  # blocks 1-4, the newest 3 pinned
    assert stream_window(config, 56, spans, room=16) == (0, 3, 4, 13)
    assert stream_window(config, 56, spans, room=28) == (0, 2, 3, 4, 12, 13)
    assert stream_window(config, 20, spans, room=16) == (0, 2, 3, 4)  # it is control


# --- randomized comparison with a plain reference -----------------------------------------


def _blocks(span: TokenSpan | None, n: int) -> list[int]:
    if span is None or span.length == 0:
        return []
    return [b for b in range(span.start // BT, (span.end - 1) // BT + 1) if b < n]


def _reference(
    config: PlannerConfig, request: WindowRequest, scores: dict[int, float]
) -> tuple[int, ...]:
    n, spans = request.n_complete, request.spans
    slots = max(0, (config.budget_tokens - request.open_tokens) // BT)
    if n <= slots:
        return tuple(range(n))
    chosen: list[int] = []

    def take(newest_first: list[int], bound: int) -> None:
        count = 0
        for b in newest_first:
            if b not in chosen and count < bound and len(chosen) < slots:
                chosen.append(b)
                count += 1

    take(list(range(min(config.sink_blocks, n))), config.sink_blocks)
    take(list(range(n - 1, -1, -1))[: config.recent_blocks], config.recent_blocks)
    take(list(reversed(_blocks(spans.control, n))), config.control_tokens // BT)
    take(list(reversed(_blocks(spans.query, n))), math.ceil(config.query_tokens / BT))
    take(list(reversed(_blocks(spans.trajectory, n))), math.ceil(config.trajectory_tokens / BT))
    take(sorted({b for b in request.forced if b < n}, reverse=True), n)
    rest = [b for b in range(n) if b not in chosen]
    if config.method is RetrievalMethod.RECENCY:
        order = sorted(rest, reverse=True)
    else:
        order = []
        while rest:  # selection sort: best score, then the more recent
            best = rest[0]
            for b in rest[1:]:
                if scores[b] > scores[best] or (scores[b] == scores[best] and b > best):
                    best = b
            order.append(best)
            rest.remove(best)
        expanded: list[int] = []  # each block, then its neighbours: b+1, b-1, b+2, ...
        for b in order:
            near = [b]
            for d in range(1, config.neighbor_blocks + 1):
                near += [b + d, b - d]
            expanded += [x for x in near if x in order and x not in expanded]
        order = expanded
    take(order, n)
    return tuple(sorted(chosen))


def _span(rng: random.Random, hi: int) -> TokenSpan | None:
    if rng.random() < 0.2:
        return None
    a = rng.randint(0, hi)
    return TokenSpan(a, rng.randint(a, hi))


def test_random_plans_match_reference() -> None:
    rng = random.Random(1234)
    for _ in range(3000):
        config = PlannerConfig(
            block_tokens=BT,
            budget_tokens=rng.randint(0, 40) * BT,
            sink_blocks=rng.randint(0, 3),
            recent_blocks=rng.randint(0, 4),
            method=rng.choice([RET, REC]),
            control_tokens=rng.randint(0, 20),
            query_tokens=rng.randint(0, 20),
            trajectory_tokens=rng.randint(0, 40),
            neighbor_blocks=rng.choice([0, 0, 1, 2]),
        )
        n = rng.randint(0, 40)
        spans = PromptSpans(*(_span(rng, n * BT + 3) for _ in range(3)))
        forced = tuple(rng.sample(range(45), rng.randint(0, 3)))
        request = WindowRequest(n, rng.randint(0, 2 * BT), spans, forced)
        on_gpu = set(rng.sample(range(45), rng.randint(0, 20)))
        scores = {b: float(rng.randint(0, 5)) for b in range(n)}  # many ties
        plan = plan_window(config, request, on_gpu, scores)
        assert plan.selected == _reference(config, request, scores)
        assert plan.keep == tuple(b for b in plan.selected if b in on_gpu)
        assert plan.stage_in == tuple(b for b in plan.selected if b not in on_gpu)
        assert plan.evict == tuple(sorted(on_gpu - set(plan.selected)))
        held = [b for blocks in plan.tiers.values() for b in blocks]
        if not plan.fits:
            assert sorted(held) == list(plan.selected)  # each block in exactly one tier
        ranked = ranked_candidates(config, request)
        only_ranked = {b: scores[b] for b in ranked}
        assert plan_window(config, request, on_gpu, only_ranked).selected == plan.selected
