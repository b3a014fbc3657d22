"""Prompt-lookup drafts verified in one batch on SmolLM2: the output is token for token the
output of plain decoding (greedy, and sampled with the same seed), the cache keeps exactly
the accepted cells, and drafts are really accepted."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from kvmem.bench.lookup_drafts import drafted_loop, plain_loop
from kvmem.engine.llama.context import ContextSettings, LlamaContext
from kvmem.engine.llama.model import LlamaModel
from kvmem.engine.llama.sampler import Sampler
from kvmem.engine.spec.speculative import accept_draft, verify_draft
from kvmem.errors import DecodeError
from kvmem.memory.ngram_draft import NgramDraftParams, draft_ngram
from kvmem.sampling import SamplingParams

pytestmark = pytest.mark.slow

GREEDY = SamplingParams(temperature=0.0)
SAMPLED = SamplingParams(temperature=0.9, top_k=40, top_p=0.95, min_p=0.05, seed=1234)
CODE = """def area(width, height):
    return width * height


def perimeter(width, height):
    return 2 * (width + height)
"""
PROMPT = (
    "<|im_start|>user\nRepeat this code exactly, then stop:\n"
    f"{CODE}<|im_end|>\n<|im_start|>assistant\n"
)
N_NEW = 48


@pytest.fixture(scope="module")
def ctx(smollm2_path: str) -> Iterator[LlamaContext]:
    model = LlamaModel(smollm2_path)
    c = LlamaContext(model, ContextSettings(n_cells=512, n_batch=64, n_threads=1))
    yield c
    c.close()
    model.close()


@pytest.fixture(scope="module")
def prompt(ctx: LlamaContext) -> list[int]:
    return ctx.model.tokenize(PROMPT, add_special=True)


@pytest.fixture(scope="module")
def plain_greedy(ctx: LlamaContext, prompt: list[int]) -> list[int]:
    return plain_loop(ctx, prompt, N_NEW, GREEDY).tokens


def ngram(n_draft: int):
    params = NgramDraftParams(n_draft=n_draft, n_min=2, n_max=8)
    return lambda history, _step: draft_ngram(history, params)


@pytest.mark.parametrize("n_draft", [3, 8])
def test_greedy_with_ngram_drafts_equals_plain_greedy(
    ctx: LlamaContext, prompt: list[int], plain_greedy: list[int], n_draft: int
) -> None:
    run = drafted_loop(ctx, prompt, N_NEW, ngram(n_draft), GREEDY)
    assert run.tokens == plain_greedy
    assert len(plain_greedy) == N_NEW  # the model echoes the code (no early stop)
    assert run.accepted >= N_NEW // 3  # the echo is drafted from the prompt
    assert run.steps < N_NEW - run.accepted // 2
    # the cache holds the prompt and every emitted token but the last, nothing rejected
    assert run.end_pos == len(prompt) + N_NEW - 1
    assert ctx.seq_pos_max(0) == run.end_pos - 1


def test_sampled_with_drafts_equals_plain_sampling(ctx: LlamaContext, prompt: list[int]) -> None:
    # one random draw per emitted token in both loops: the same seed, the same output
    plain = plain_loop(ctx, prompt, N_NEW, SAMPLED).tokens
    run = drafted_loop(ctx, prompt, N_NEW, ngram(6), SAMPLED)
    assert run.tokens == plain
    assert run.accepted > 0


def test_oracle_and_wrong_drafts(
    ctx: LlamaContext, prompt: list[int], plain_greedy: list[int]
) -> None:
    # drafts from the known output with every 5th draft corrupted: partial acceptance
    def oracle(_history: list[int], step: int) -> list[int]:
        draft = plain_greedy[step : step + 6]
        return [t if (step + i) % 5 else (t + 1) % 1000 for i, t in enumerate(draft)]

    run = drafted_loop(ctx, prompt, N_NEW, oracle, GREEDY)
    assert run.tokens == plain_greedy
    assert 0 < run.accepted < run.drafted

    # a fully wrong draft: nothing accepted, its cells removed, the correction emitted
    ctx.clear()
    ctx.decode(prompt, 0, [False] * (len(prompt) - 1) + [True])
    sampler = Sampler(ctx.model.vocab, GREEDY)
    try:
        first = sampler.sample(ctx.ptr, -1)
        assert first == plain_greedy[0]
        pos = len(prompt)
        wrong = [(t + 7) % 1000 for t in plain_greedy[1:5]]
        result = verify_draft(ctx, sampler, pos, first, wrong)
        assert (result.n_drafted, result.n_accepted, result.tokens) == (4, 0, plain_greedy[1:2])
        assert ctx.seq_pos_max(0) == pos  # only `first` was kept
        # a fully right draft: all accepted plus the bonus token
        result = verify_draft(ctx, sampler, pos + 1, plain_greedy[1], plain_greedy[2:6])
        assert (result.n_accepted, result.tokens) == (4, plain_greedy[2:7])
        assert ctx.seq_pos_max(0) == pos + 5
        with pytest.raises(ValueError, match="3 draft tokens need 4 logit rows"):
            accept_draft(ctx, sampler, [1, 2, 3], [0, 1], ctx.model.is_eog)
        with pytest.raises(DecodeError, match="a draft of 64 tokens does not fit the batch of 64"):
            verify_draft(ctx, sampler, pos + 6, result.tokens[-1], [1] * 64)
        assert ctx.seq_pos_max(0) == pos + 5  # refused before decoding anything
    finally:
        sampler.close()


def test_logits_after_verification_match_plain_decoding(
    ctx: LlamaContext, prompt: list[int], plain_greedy: list[int]
) -> None:
    """After a partially accepted draft, decoding the next token sees the same cache as
    plain decoding (the rejected cells are really gone)."""
    ctx.clear()
    ctx.decode(prompt, 0, [False] * (len(prompt) - 1) + [True])
    sampler = Sampler(ctx.model.vocab, GREEDY)
    try:
        first = sampler.sample(ctx.ptr, -1)
        draft = [*plain_greedy[1:3], 5, 6]  # two right, then wrong
        result = verify_draft(ctx, sampler, len(prompt), first, draft)
        assert result.n_accepted == 2 and result.tokens == plain_greedy[1:4]
        ctx.decode([result.tokens[-1]], len(prompt) + 3, [True])
        spec_logits = ctx.logits(-1)
    finally:
        sampler.close()
    ctx.clear()
    ctx.decode([*prompt, *plain_greedy[:4]], 0, [False] * (len(prompt) + 3) + [True])
    plain_logits = ctx.logits(-1)
    assert int(np.argmax(spec_logits)) == int(np.argmax(plain_logits)) == plain_greedy[4]
    np.testing.assert_allclose(spec_logits, plain_logits, atol=1e-3)
