"""`kvmem-bench lookup-drafts`: prompt-lookup drafts against plain decoding, in one run.

An agent turn that shows a file and asks for it back with one change; the model answers
greedily twice on a bare llama.cpp context (no KVMem window): plain decoding, one token per
decode, then with drafts from `memory.ngram_draft` verified in one batch per step
(`engine.speculative`). Reported: whether the outputs are identical (they must be), decode
tok/s of both, the speedup, verification steps and the acceptance rate. The two loops are
also the reference the engine tests check the verifier with.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from kvmem.bench.report import add_run_arguments, format_table, machine_description, write_json
from kvmem.chat.template import ChatTemplate
from kvmem.cli.kvmem_flags import strict_int
from kvmem.errors import ConfigError
from kvmem.gguf.model_path import resolve_model_path
from kvmem.memory.ngram_draft import NgramDraftParams, draft_ngram
from kvmem.sampling import SamplingParams

if TYPE_CHECKING:
    from kvmem.engine.llama.context import LlamaContext
    from kvmem.engine.llama.host_staging import StagingBuffer

GREEDY = SamplingParams(temperature=0.0)
Drafter = Callable[[list[int], int], list[int]]  # (history, tokens emitted so far) -> draft


@dataclass(slots=True)
class LoopRun:
    tokens: list[int] = field(default_factory=list)
    steps: int = 0  # decode calls after the prefill
    drafted: int = 0
    accepted: int = 0
    end_pos: int = 0  # position of the last token (sampled, not decoded)
    seconds: float = 0.0  # generation only, after the prefill


def _prefill(ctx: LlamaContext, prompt: Sequence[int]) -> None:
    ctx.clear()
    for start in range(0, len(prompt), ctx.n_batch):
        chunk = list(prompt[start : start + ctx.n_batch])
        last = start + len(chunk) == len(prompt)
        ctx.decode(chunk, start, [False] * (len(chunk) - 1) + [last])


def plain_loop(
    ctx: LlamaContext, prompt: Sequence[int], n_new: int, params: SamplingParams = GREEDY
) -> LoopRun:
    """Decode one token at a time until n_new tokens or an end-of-generation token."""
    from kvmem.engine.llama.sampler import Sampler

    _prefill(ctx, prompt)
    sampler = Sampler(ctx.model.vocab, params)
    run = LoopRun()
    pos = len(prompt)
    t0 = time.perf_counter()
    try:
        while True:
            token = sampler.sample(ctx.ptr, -1)
            run.tokens.append(token)
            if len(run.tokens) == n_new or ctx.model.is_eog(token):
                break
            ctx.decode([token], pos, [True])
            pos += 1
            run.steps += 1
    finally:
        sampler.close()
    run.end_pos, run.seconds = pos, time.perf_counter() - t0
    return run


def drafted_loop(
    ctx: LlamaContext,
    prompt: Sequence[int],
    n_new: int,
    drafter: Drafter,
    params: SamplingParams = GREEDY,
    staging: StagingBuffer | None = None,
) -> LoopRun:
    """The same generation, each step verifying `drafter`'s proposal in one batch
    (`staging`: where a hybrid's recurrent snapshots go, as verify_draft's)."""
    from kvmem.engine.llama.sampler import Sampler
    from kvmem.engine.spec.speculative import verify_draft

    _prefill(ctx, prompt)
    sampler = Sampler(ctx.model.vocab, params)
    run = LoopRun()
    pos = len(prompt)
    t0 = time.perf_counter()
    try:
        run.tokens.append(sampler.sample(ctx.ptr, -1))
        while len(run.tokens) < n_new and not ctx.model.is_eog(run.tokens[-1]):
            room = min(n_new - len(run.tokens) - 1, ctx.n_batch - 1)  # a step emits k + 1
            draft = drafter([*prompt, *run.tokens], len(run.tokens))[:room]
            result = verify_draft(ctx, sampler, pos, run.tokens[-1], draft, staging=staging)
            run.steps += 1
            run.drafted += result.n_drafted
            run.accepted += result.n_accepted
            pos += result.next_pos
            run.tokens += result.tokens
    finally:
        sampler.close()
    run.end_pos, run.seconds = pos, time.perf_counter() - t0
    return run


def ngram_drafter(params: NgramDraftParams) -> Drafter:
    return lambda history, _emitted: draft_ngram(history, params)


def source_file(n_functions: int) -> str:
    """A deterministic Python module of n_functions small functions."""
    parts = ['"""Geometry helpers."""\n']
    for i in range(n_functions):
        parts.append(
            f"\n\ndef shape_{i}_area(width, height):\n"
            f'    """Area of shape {i}, scaled by {i + 2}."""\n'
            f"    scale = {i + 2}\n"
            f"    return scale * width * height\n"
        )
    return "".join(parts)


def rewrite_messages(n_functions: int) -> list[dict[str, str]]:
    """An agent turn: the tool showed a file; rewrite it with one rename."""
    return [
        {"role": "system", "content": "You are a coding agent. Answer with code only."},
        {
            "role": "user",
            "content": "Here is geometry.py:\n```python\n"
            + source_file(n_functions)
            + "```\nRewrite the whole file, renaming `width` to `w` everywhere. "
            "Output the complete file.",
        },
    ]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "lookup-drafts", help="prompt-lookup drafts vs plain decoding (identity, speedup)"
    )
    p.add_argument("-m", "--model", default=None, metavar="PATH.gguf", help="default: SmolLM2")
    p.add_argument("--max-tokens", type=strict_int, default=256)
    p.add_argument("--n-draft", type=strict_int, default=8, help="draft tokens per step")
    p.add_argument("--n-min", type=strict_int, default=2, help="shortest tail match")
    p.add_argument("--n-max", type=strict_int, default=8, help="longest tail match ranked")
    p.add_argument("--functions", type=strict_int, default=24, help="size of the shown file")
    p.add_argument("-c", "--ctx-size", type=strict_int, default=8192)
    add_run_arguments(p)
    p.set_defaults(handler=run)


def run(ns: argparse.Namespace) -> int:
    try:
        draft_params = NgramDraftParams(n_draft=ns.n_draft, n_min=ns.n_min, n_max=ns.n_max)
    except ValueError as exc:
        raise ConfigError("--n-draft/--n-min/--n-max", str(exc)) from None
    for flag, value in (("--max-tokens", ns.max_tokens), ("--functions", ns.functions)):
        if value <= 0:
            raise ConfigError(flag, f"must be positive, got {value}")
    from kvmem.engine.llama.context import ContextSettings, LlamaContext
    from kvmem.engine.llama.model import LlamaModel

    path = resolve_model_path(ns.model)
    model = LlamaModel(path, ns.gpu_layers)
    settings = ContextSettings(n_cells=ns.ctx_size, n_batch=ns.batch_size, n_threads=ns.threads)
    ctx = LlamaContext(model, settings)
    try:
        template = ChatTemplate.from_engine_info(model.describe(ns.ctx_size))
        text = template.render(rewrite_messages(ns.functions))
        prompt = model.tokenize(text, add_special=True)
        if len(prompt) + ns.max_tokens > ns.ctx_size:
            raise ConfigError("-c", f"{len(prompt)} prompt + {ns.max_tokens} tokens do not fit")
        plain = plain_loop(ctx, prompt, ns.max_tokens)
        drafted = drafted_loop(ctx, prompt, ns.max_tokens, ngram_drafter(draft_params))
    finally:
        ctx.close()
        model.close()
    identical = plain.tokens == drafted.tokens
    speedup = plain.seconds / drafted.seconds if drafted.seconds else 0.0
    rows = [
        [name, len(r.tokens), r.seconds, len(r.tokens) / r.seconds, r.steps, r.drafted, r.accepted]
        for name, r in (("plain", plain), (f"ngram n_draft={ns.n_draft}", drafted))
    ]
    headers = ["decoding", "tokens", "seconds", "tok/s", "steps", "drafted", "accepted"]
    print(format_table(headers, rows, title=f"prompt {len(prompt)} tokens, greedy"))
    acceptance = drafted.accepted / drafted.drafted if drafted.drafted else 0.0
    print(f"identical: {identical}  speedup: {speedup:.2f}x  acceptance: {acceptance:.1%}")
    payload = {
        "command": "lookup-drafts",
        "model": path,
        "settings": {k: v for k, v in vars(ns).items() if k != "handler"},
        "machine": machine_description(),
        "prompt_tokens": len(prompt),
        "identical": identical,
        "speedup": speedup,
        "acceptance": acceptance,
        "runs": {"plain": asdict(plain), "drafted": asdict(drafted)},
    }
    out = write_json(ns.out, "lookup_drafts.json", payload)
    if out is not None:
        print(f"wrote {out}")
    return 0 if identical else 1
