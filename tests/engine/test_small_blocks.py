"""64-token blocks over the budget (issue 33): the prefill's chunk leaves a stream window of
four blocks, which the sink and a long control text would fill. The block right before
each chunk stays in it, so llama.cpp decodes the chunk after the sequence's last cell
(before the fix: `llama_decode failed with code -1 at position 896`), turn after turn."""

from __future__ import annotations

import pytest

from kvmem.config import KVMemConfig
from kvmem.memory.spans import PromptSpans, TokenSpan

from .helpers import GREEDY, filler_tokens, make_engine

pytestmark = pytest.mark.slow

BT = 64
CONTROL = TokenSpan(10, 330)  # five blocks: more than the stream window's room besides the sink


@pytest.fixture(scope="module")
def engine(smollm2_path):
    # chunks of 896 tokens (-b 2048 and no --kvmem-chunk-tokens cap below it): a 256-token
    # room for the stream window
    kv = KVMemConfig(budget=1024, gen_reserve=128, block_tokens=BT, chunk_tokens=2048)
    made = make_engine(smollm2_path, n_ctx=4096, kvmem=kv, n_batch=2048, n_ubatch=512)
    yield made
    made.close()


def _spans(n: int) -> PromptSpans:
    return PromptSpans(
        control=CONTROL,
        query=TokenSpan(330, 400),
        trajectory=TokenSpan(400, n),
        live=TokenSpan(n - 40, n),
    )


def _answer(engine, prompt: list[int]) -> list[int]:
    out = engine.generate(
        prompt, query=_spans(len(prompt)), sampling=GREEDY, max_tokens=6, ignore_eos=True
    )
    return list(out)


def test_two_turns_over_budget_with_a_control_text_filling_the_stream_room(engine):
    assert engine.session.chunk_tokens == 896 and engine.session.capacity == 1152
    base = filler_tokens(engine, 1900, seed=7)
    engine.reset()
    prompt = list(base[:1200])
    prompts, answers = [], []
    for step in range(2):
        out = _answer(engine, prompt)
        turn = engine.last_turn
        assert len(out) == 6 and turn.generated_tokens == 6
        assert turn.evicted_blocks > 0  # over the budget: the stream window moved blocks
        assert engine.session.window.cells_used() <= 1152
        prompts.append(list(prompt))
        answers.append(out)
        prompt = prompt + out + list(base[1200 + 300 * step : 1500 + 300 * step])
    assert engine.last_turn.cached_tokens > 1000  # the second turn reused the first
    engine.reset()
    assert [_answer(engine, p) for p in prompts[1:]] == answers[1:]  # as a fresh session
