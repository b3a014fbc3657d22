"""plan_window and plan_eviction: exact plans by hand and against a plain reference planner."""

from __future__ import annotations

import random

import pytest

from kvmem.errors import MemoryLayoutError
from kvmem.memory.planner import (
    PlannerConfig,
    RetrievalMethod,
    WindowPlan,
    plan_eviction,
    plan_window,
    scored_candidates,
)

RET, REC = RetrievalMethod.RETRIEVAL, RetrievalMethod.RECENCY
SCORES = {1: 0.1, 2: 0.5, 3: 0.2, 4: 0.5, 5: 0.05, 6: 0.3, 7: 0.0, 8: 0.9, 9: 0.0}


def _config(
    budget: int = 24, method: RetrievalMethod = RET, sink: int = 1, recent: int = 2
) -> PlannerConfig:
    return PlannerConfig(
        block_tokens=4, budget_tokens=budget, sink_blocks=sink, recent_blocks=recent, method=method
    )


def test_all_fit() -> None:
    plan = plan_window(_config(), range(5), on_gpu=[0, 1, 2], scores=None, tail_tokens=3)
    assert plan == WindowPlan(
        selected=(0, 1, 2, 3, 4),
        sink=(0,),
        recent=(3, 4),
        retrieved=(),
        keep=(0, 1, 2),
        stage_in=(3, 4),
        stage_out=(),
    )
    assert plan.changed


def test_sink_recent_and_top_scores_with_diff() -> None:
    plan = plan_window(
        _config(), range(10), on_gpu={0, 1, 2, 8, 9, 12}, scores=SCORES, tail_tokens=0
    )
    # 6 slots: sink 0, recent 8 9, then 3 by score among 1..7: 4 and 2 tie at 0.5 (4 is more recent), then 6
    assert plan == WindowPlan(
        selected=(0, 2, 4, 6, 8, 9),
        sink=(0,),
        recent=(8, 9),
        retrieved=(2, 4, 6),
        keep=(0, 2, 8, 9),
        stage_in=(4, 6),
        stage_out=(1, 12),
    )
    assert plan.changed


def test_ties_prefer_recent_blocks() -> None:
    plan = plan_window(
        _config(), range(10), on_gpu=(), scores=dict.fromkeys(range(10), 1.0), tail_tokens=0
    )
    assert plan.retrieved == (5, 6, 7)
    assert plan.selected == (0, 5, 6, 7, 8, 9)


def test_unchanged_window() -> None:
    plan = plan_window(
        _config(), range(10), on_gpu=(0, 2, 4, 6, 8, 9), scores=SCORES, tail_tokens=0
    )
    assert plan.keep == plan.selected == (0, 2, 4, 6, 8, 9)
    assert plan.stage_in == plan.stage_out == ()
    assert not plan.changed


def test_recency_method() -> None:
    plan = plan_window(_config(method=REC), range(10), on_gpu=(0, 1), scores=None, tail_tokens=0)
    assert plan == WindowPlan(
        selected=(0, 5, 6, 7, 8, 9),
        sink=(0,),
        recent=(5, 6, 7, 8, 9),
        retrieved=(),
        keep=(0,),
        stage_in=(5, 6, 7, 8, 9),
        stage_out=(1,),
    )


def test_tail_tokens_reduce_slots() -> None:
    plan = plan_window(_config(), range(10), on_gpu=(), scores=SCORES, tail_tokens=5)
    # (24 - 5) // 4 = 4 slots: sink, two recent, one retrieved (4 beats 2 on the tie)
    assert plan.selected == (0, 4, 8, 9)
    assert plan.retrieved == (4,)
    plan = plan_window(_config(), range(10), on_gpu=(), scores=SCORES, tail_tokens=30)
    assert plan.selected == ()


def test_budget_smaller_than_sink_and_recent() -> None:
    plan = plan_window(_config(budget=8), range(10), on_gpu=(), scores=SCORES, tail_tokens=0)
    assert (plan.selected, plan.sink, plan.recent, plan.retrieved) == ((0, 9), (0,), (9,), ())
    plan = plan_window(_config(budget=4), range(10), on_gpu=(), scores=SCORES, tail_tokens=0)
    assert (plan.selected, plan.sink, plan.recent) == ((0,), (0,), ())
    plan = plan_window(
        _config(budget=4, sink=2), range(10), on_gpu=(), scores=SCORES, tail_tokens=0
    )
    assert (plan.selected, plan.sink, plan.recent) == ((0,), (0,), ())
    plan = plan_window(
        _config(budget=12, sink=0, recent=5), range(10), on_gpu=(), scores=SCORES, tail_tokens=0
    )
    assert (plan.selected, plan.sink, plan.recent) == ((7, 8, 9), (), (7, 8, 9))


def test_sink_wins_overlap_when_all_fit() -> None:
    plan = plan_window(_config(sink=2, recent=2), [3, 4, 5], on_gpu=(), scores=None, tail_tokens=0)
    assert (plan.selected, plan.sink, plan.recent) == ((3, 4, 5), (3, 4), (5,))


def test_missing_scores_rank_last_and_retrieval_needs_scores() -> None:
    plan = plan_window(_config(), range(10), on_gpu=(), scores={1: 0.0, 3: -5.0}, tail_tokens=0)
    assert plan.retrieved == (1, 3, 7)
    with pytest.raises(MemoryLayoutError):
        plan_window(_config(), range(10), on_gpu=(), scores=None, tail_tokens=0)
    with pytest.raises(MemoryLayoutError):
        plan_window(_config(), [0, 2, 1], on_gpu=(), scores=SCORES, tail_tokens=0)


def test_eviction_order() -> None:
    config = _config()
    on_gpu = (0, 1, 3, 5, 8, 9, 10)  # 10: the open tail block, not a candidate
    cands = range(10)
    assert plan_eviction(config, on_gpu, cands, preferred={3, 8}, n_blocks=3) == (1, 5, 3)
    assert plan_eviction(config, on_gpu, cands, preferred={3, 8}, n_blocks=4) == (1, 5, 3, 8)
    assert plan_eviction(config, on_gpu, cands, preferred={3, 8}, n_blocks=10) == (1, 5, 3, 8, 9, 0)
    assert plan_eviction(config, on_gpu, cands, preferred=(), n_blocks=0) == ()
    assert plan_eviction(config, (), cands, preferred=(), n_blocks=2) == ()


# --- randomized comparison with a plain reference -----------------------------------------


def _reference_plan(
    config: PlannerConfig, cands: list[int], on_gpu: set[int], scores: dict[int, float], tail: int
) -> tuple[tuple[int, ...], ...]:
    slots = (config.budget_tokens - tail) // config.block_tokens
    if slots < 0:
        slots = 0
    if len(cands) <= slots:
        selected = list(cands)
    else:
        selected: list[int] = []
        for b in cands[: config.sink_blocks]:
            if len(selected) < slots:
                selected.append(b)
        taken = 0
        i = len(cands) - 1
        while taken < config.recent_blocks and len(selected) < slots and i >= 0:
            if cands[i] not in selected:
                selected.append(cands[i])
                taken += 1
            i -= 1
        rest = [b for b in cands if b not in selected]
        if config.method is RetrievalMethod.RECENCY:
            order = list(reversed(rest))
        else:
            order: list[int] = []
            while rest:  # selection sort: best score, then the more recent
                best = rest[0]
                for b in rest[1:]:
                    if scores[b] > scores[best] or (scores[b] == scores[best] and b > best):
                        best = b
                order.append(best)
                rest.remove(best)
        for b in order:
            if len(selected) < slots:
                selected.append(b)
    selected = sorted(selected)
    keep = [b for b in selected if b in on_gpu]
    stage_in = [b for b in selected if b not in on_gpu]
    stage_out = sorted(b for b in on_gpu if b not in selected)
    return tuple(selected), tuple(keep), tuple(stage_in), tuple(stage_out)


def _reference_eviction(
    config: PlannerConfig, on_gpu: set[int], cands: list[int], preferred: set[int], n: int
) -> tuple[int, ...]:
    sink = list(cands[: config.sink_blocks])
    recent = (
        [b for b in cands[len(cands) - config.recent_blocks :] if b not in sink]
        if config.recent_blocks
        else []
    )
    order: list[int] = []
    for tier in range(4):
        for b in sorted(on_gpu):
            if b not in cands:
                continue
            if tier == 0 and b not in sink and b not in recent and b not in preferred:
                order.append(b)
            if tier == 1 and b not in sink and b not in recent and b in preferred:
                order.append(b)
            if tier == 2 and b in recent:
                order.append(b)
            if tier == 3 and b in sink:
                order.append(b)
    return tuple(order[:n])


def test_random_plans_match_reference() -> None:
    rng = random.Random(1234)
    for _ in range(3000):
        method = rng.choice([RET, REC])
        config = PlannerConfig(
            block_tokens=rng.choice([1, 4, 32]),
            budget_tokens=rng.randint(0, 40) * rng.choice([1, 4, 32]),
            sink_blocks=rng.randint(0, 3),
            recent_blocks=rng.randint(0, 4),
            method=method,
        )
        cands = sorted(rng.sample(range(40), rng.randint(0, 25)))
        on_gpu = set(rng.sample(range(45), rng.randint(0, 20)))
        scores = {b: float(rng.randint(0, 5)) for b in cands}  # many ties
        tail = rng.randint(0, 3 * config.block_tokens)
        plan = plan_window(config, cands, on_gpu, scores, tail)
        expected = _reference_plan(config, cands, on_gpu, scores, tail)
        assert (plan.selected, plan.keep, plan.stage_in, plan.stage_out) == expected
        assert set(plan.sink) | set(plan.recent) | set(plan.retrieved) <= set(plan.selected)
        if len(cands) > (config.budget_tokens - tail) // config.block_tokens:
            assert set(plan.sink) | set(plan.recent) | set(plan.retrieved) == set(plan.selected)
        preferred = set(rng.sample(range(40), rng.randint(0, 10)))
        n = rng.randint(0, 12)
        assert plan_eviction(config, sorted(on_gpu), cands, preferred, n) == _reference_eviction(
            config, on_gpu, cands, preferred, n
        )


def test_scored_candidates_are_exactly_the_blocks_the_plan_ranks() -> None:
    rng = random.Random(99)
    for _ in range(3000):
        config = PlannerConfig(
            block_tokens=rng.choice([1, 4]),
            budget_tokens=rng.randint(0, 40) * 4,
            sink_blocks=rng.randint(0, 3),
            recent_blocks=rng.randint(0, 4),
            method=RET,
        )
        cands = sorted(rng.sample(range(40), rng.randint(0, 25)))
        tail = rng.randint(0, 3 * config.block_tokens)
        scores = {b: float(rng.randint(0, 5)) for b in cands}
        with_scores = plan_window(config, cands, set(), scores, tail)
        ranked = scored_candidates(config, cands, tail)
        if ranked:
            assert with_scores.retrieved  # free slots are filled by score
            assert set(ranked).isdisjoint(with_scores.sink + with_scores.recent)
            only_ranked = {b: scores[b] for b in ranked}
            assert plan_window(config, cands, set(), only_ranked, tail) == with_scores
        else:
            assert plan_window(config, cands, set(), None, tail) == with_scores
    assert scored_candidates(_config(method=REC), range(100), 0) == ()
    # 6 slots: sink 0 + recent 8, 9, and 3 slots by score among blocks 1..7
    assert scored_candidates(_config(budget=24), range(10), 0) == (1, 2, 3, 4, 5, 6, 7)
    assert scored_candidates(_config(budget=24), range(6), 0) == ()  # all fit
    assert scored_candidates(_config(budget=24), range(10), 12) == ()  # sink + recent only
