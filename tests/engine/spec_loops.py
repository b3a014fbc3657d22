"""Generation loops on a bare LlamaContext: plain decoding, and decoding with verified drafts."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import llama_cpp

from kvmem.engine.context import LlamaContext
from kvmem.engine.sampler import Sampler, SamplingParams
from kvmem.engine.speculative import verify_draft

Drafter = Callable[[list[int], int], list[int]]  # (history, step) -> draft


def tokenize(ctx: LlamaContext, text: str) -> list[int]:
    data = text.encode()
    buf = (llama_cpp.llama_token * (len(data) + 16))()
    n = llama_cpp.llama_tokenize(ctx.model.vocab, data, len(data), buf, len(buf), True, True)
    assert n > 0
    return list(buf[:n])


def _prefill(ctx: LlamaContext, prompt: Sequence[int]) -> None:
    ctx.clear()
    ctx.decode(list(prompt), 0, [False] * (len(prompt) - 1) + [True])


def plain_generate(
    ctx: LlamaContext, prompt: Sequence[int], n_new: int, params: SamplingParams
) -> list[int]:
    _prefill(ctx, prompt)
    sampler = Sampler(ctx.model.vocab, params)
    out: list[int] = []
    pos = len(prompt)
    try:
        while True:
            token = sampler.sample(ctx.ptr, -1)
            out.append(token)
            if len(out) == n_new or ctx.model.is_eog(token):
                return out
            ctx.decode([token], pos, [True])
            pos += 1
    finally:
        sampler.close()


@dataclass(slots=True)
class SpecRun:
    tokens: list[int] = field(default_factory=list)
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    end_pos: int = 0  # the position of the last token (sampled, not decoded)


def spec_generate(
    ctx: LlamaContext,
    prompt: Sequence[int],
    n_new: int,
    params: SamplingParams,
    drafter: Drafter,
) -> SpecRun:
    _prefill(ctx, prompt)
    sampler = Sampler(ctx.model.vocab, params)
    run = SpecRun()
    pos = len(prompt)
    try:
        run.tokens.append(sampler.sample(ctx.ptr, -1))
        while len(run.tokens) < n_new and not ctx.model.is_eog(run.tokens[-1]):
            room = n_new - len(run.tokens) - 1  # the step emits len(draft accepted) + 1
            draft = drafter([*prompt, *run.tokens], len(run.tokens))[:room]
            result = verify_draft(ctx, sampler, pos, run.tokens[-1], draft)
            run.steps += 1
            run.drafted += result.n_drafted
            run.accepted += result.n_accepted
            assert len(result.tokens) == result.n_accepted + 1
            pos += result.next_pos
            run.tokens += result.tokens
        run.end_pos = pos
        return run
    finally:
        sampler.close()
