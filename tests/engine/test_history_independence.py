"""Answers depend on the request's tokens alone, never on what the session saw before:
a warm session gives the greedy tokens of a fresh one, over a budget where blocks move."""

from __future__ import annotations

import pytest

from kvmem.config import CellOrder, KVMemConfig, QuerySource
from kvmem.memory.spans import TokenSpan

from .helpers import GREEDY, filler_tokens, make_engine

pytestmark = pytest.mark.slow

BT = 128


# the blocks in position order from cell 0 after every change: sums in a fixed order
CANONICAL = CellOrder.CANONICAL


@pytest.fixture(scope="module")
def engine(smollm2_path):
    kv = KVMemConfig(budget=512, gen_reserve=256, cell_order=CANONICAL)
    made = make_engine(smollm2_path, n_ctx=8192, kvmem=kv)
    yield made
    made.close()


def _answer(engine, prompt: list[int], n_query: int = 30) -> list[int]:
    span = TokenSpan(len(prompt) - n_query, len(prompt))
    return list(
        engine.generate(prompt, query=span, sampling=GREEDY, max_tokens=12, ignore_eos=True)
    )


def _fresh(engine, prompt: list[int]) -> list[int]:
    engine.reset()
    return _answer(engine, prompt)


def test_cold_and_warm_pass_of_one_request_agree(engine):
    prompt = filler_tokens(engine, 2000, seed=41)
    engine.reset()
    cold = _answer(engine, prompt)
    assert engine.last_turn.replayed_tokens > 0  # the window changed under the query
    warm = _answer(engine, prompt)
    assert engine.last_turn.cached_tokens > 1500
    assert cold == warm


def test_an_edited_first_turn_answers_as_a_fresh_session(engine):
    base = filler_tokens(engine, 2600, seed=42)
    engine.reset()
    _answer(engine, base[:2400])
    edited = list(base[:2400])
    edited[300] = engine.tokenize(" purple")[0]  # not on a chunk or block boundary
    warm = _answer(engine, edited)
    assert engine.last_turn.cached_tokens == 256  # the edit at 300: back to its ubatch
    assert warm == _fresh(engine, edited)


def _built_up(engine) -> tuple[list[list[int]], list[list[int]]]:
    """Six turns on one session, each prompt the last one + its answer + 350 new tokens:
    the prompts and the warm session's answers."""
    base = filler_tokens(engine, 3200, seed=43)
    engine.reset()
    prompt = list(base[:700])
    warm_answers, prompts = [], []
    for step in range(6):
        out = _answer(engine, prompt)
        assert engine.session.window.cells_used() <= 512 + 256
        warm_answers.append(out)
        prompts.append(list(prompt))
        prompt = prompt + out + list(base[700 + 350 * step : 1050 + 350 * step])
    return prompts, warm_answers


def test_turns_built_up_one_by_one_answer_as_fresh_sessions(engine):
    prompts, warm_answers = _built_up(engine)
    assert engine.stats.stage_in_blocks > 0 and engine.stats.replayed_tokens > 0
    assert [_fresh(engine, p) for p in prompts] == warm_answers


def test_copy_threads_answer_as_the_caller_thread(engine, smollm2_path, monkeypatch):
    """Harvest copy-outs on three threads (overlapping the next chunk) give the same greedy
    tokens, turn by turn over a budget where blocks move, as copying on the caller's thread."""
    monkeypatch.setenv("KVMEM_COPY_THREADS", "3")
    kv = KVMemConfig(budget=512, gen_reserve=256, cell_order=CANONICAL)
    threaded = make_engine(smollm2_path, n_ctx=8192, kvmem=kv)
    try:
        assert threaded.session.transfer.copier is not None
        base = filler_tokens(engine, 2400, seed=44)
        engine.reset()
        threaded.reset()
        prompt = list(base[:700])
        for step in range(3):
            out = _answer(threaded, prompt)
            assert out == _answer(engine, prompt)
            prompt = prompt + out + list(base[700 + 450 * step : 1150 + 450 * step])
        assert threaded.stats.stage_in_blocks > 0
    finally:
        threaded.close()


@pytest.fixture(scope="module")
def scoring(smollm2_path):
    """Query vectors from the scoring context: the tail is decoded once, after the plan."""
    kv = KVMemConfig(
        budget=512, gen_reserve=256, query_source=QuerySource.SCORING, cell_order=CANONICAL
    )
    made = make_engine(smollm2_path, n_ctx=8192, kvmem=kv)
    yield made
    made.close()


def test_deferred_tail_cold_and_warm_agree(scoring):
    prompt = filler_tokens(scoring, 2000, seed=41)
    scoring.reset()
    cold = _answer(scoring, prompt)
    turn = scoring.last_turn
    assert turn.replayed_tokens == 0 and turn.deferred_tokens == 2000 - 1920  # block 15 on
    assert turn.evicted_blocks > 0  # blocks moved under the prefill
    warm = _answer(scoring, prompt)
    # up to the tail's chunk: the tail saw a chosen window, and a resumed prefill starts
    # where a fresh one's chunk does (chunks of 256 here)
    assert scoring.session.grid.chunk_tokens == 256
    assert scoring.last_turn.cached_tokens == 1792
    assert cold == warm


def test_deferred_tail_turns_built_up_one_by_one_answer_as_fresh_sessions(scoring):
    """With the scoring source the warm session's cell order flipped a greedy token from the
    fourth turn at this seed (an xfail until the canonical cell order)."""
    prompts, warm_answers = _built_up(scoring)
    assert scoring.stats.stage_in_blocks > 0 and scoring.stats.replayed_tokens == 0
    assert [_fresh(scoring, p) for p in prompts] == warm_answers
