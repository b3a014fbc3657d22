"""`--kvmem-rank exact` (the fidelity oracle) and `rerank` on SmolLM2: the retrieved tier is the
top of the exact attention mass, and answers stay history-independent."""

from __future__ import annotations

import pytest

from kvmem.config import KVMemConfig, LexicalMode
from kvmem.memory.exact_scorer import RankMode, exact_block_scores
from kvmem.memory.planner import Tier
from kvmem.memory.spans import TokenSpan

from .helpers import GREEDY, filler_tokens, make_engine

pytestmark = pytest.mark.slow

BT = 128


@pytest.fixture(scope="module")
def engine(smollm2_path):
    config = KVMemConfig(
        budget=1024,
        gen_reserve=256,
        rank=RankMode.EXACT,
        lexical=LexicalMode.OFF,
        stream_tokens=512,  # the prefill leaves the middle blocks for the retrieval to restore
    )
    made = make_engine(smollm2_path, n_ctx=8192, kvmem=config)
    yield made
    made.close()


def _answer(engine, prompt: list[int]) -> list[int]:
    span = TokenSpan(len(prompt) - 30, len(prompt))
    return list(engine.generate(prompt, query=span, sampling=GREEDY, max_tokens=8, ignore_eos=True))


def test_exact_rank_retrieves_the_top_of_the_exact_mass_and_cold_equals_warm(engine):
    prompt = filler_tokens(engine, 1900, seed=51)
    engine.reset()
    cold = _answer(engine, prompt)
    assert engine.last_turn.stage_in_blocks > 0
    session = engine.session
    plan = session.last_plan
    retrieved = plan.tier(Tier.RETRIEVED)
    # 14 complete blocks, 7 slots next to the open block: sink 0, recent 12-13, 4 retrieved
    assert plan.tier(Tier.SINK) == (0,) and plan.tier(Tier.RECENT) == (12, 13)
    assert len(retrieved) == 4
    pinned = {b for t, blocks in plan.tiers.items() if t is not Tier.RETRIEVED for b in blocks}
    middle = [b for b in range(len(prompt) // BT) if b not in pinned]
    scores = exact_block_scores(session.store, engine.key_geometry, middle, session.last_query)
    ranked = sorted(middle, key=lambda b: (-float(scores[middle.index(b)]), -b))
    assert sorted(ranked[:4]) == list(retrieved)
    warm = _answer(engine, prompt)
    assert engine.last_turn.cached_tokens > 1500
    assert cold == warm


@pytest.fixture(scope="module")
def rerank_engine(smollm2_path):
    config = KVMemConfig(budget=1024, gen_reserve=256, rank=RankMode.RERANK, stream_tokens=512)
    made = make_engine(smollm2_path, n_ctx=8192, kvmem=config)
    yield made
    made.close()


def test_rerank_restores_blocks_and_cold_equals_warm(rerank_engine):
    engine = rerank_engine
    prompt = filler_tokens(engine, 1900, seed=51)
    engine.reset()
    cold = _answer(engine, prompt)
    assert engine.last_turn.stage_in_blocks > 0
    assert len(engine.session.last_plan.tier(Tier.RETRIEVED)) == 4
    warm = _answer(engine, prompt)
    assert engine.last_turn.cached_tokens > 1500
    assert cold == warm
