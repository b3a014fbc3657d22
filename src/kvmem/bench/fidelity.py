"""`kvmem-bench fidelity`: teacher-forced agreement of KVMem with a full context.

Over the same multi-turn agent transcript, each turn's assistant answer is teacher-forced
through a full-context engine (the reference) and through KVMem engines at a budget. Per
scored token: KL(full || kvmem) of the next-token distribution and top-1 agreement; per
turn: the attention-mass coverage of the selected window at the scored layers.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from tqdm import tqdm

from kvmem.bench.conversation import make_renderer
from kvmem.bench.coverage import window_coverage
from kvmem.bench.engines import (
    BenchEngine,
    BenchSettings,
    EngineFactory,
    LlamaEngineFactory,
    Method,
    add_engine_arguments,
    parse_methods,
    settings_from_args,
    turn_profile,
)
from kvmem.bench.reference_cache import load_reference, reference_key, save_reference
from kvmem.bench.report import format_table, machine_description, write_json
from kvmem.bench.transcript import build_transcript, history_through
from kvmem.cli.kvmem_flags import strict_int
from kvmem.cli.progress_bar import stderr_bar
from kvmem.errors import ConfigError
from kvmem.memory.spans import PromptSpans, TokenSpan

logger = logging.getLogger(__name__)

DEFAULT_METHODS = (Method.RETRIEVAL, Method.RECENCY)
# Why fidelity has no compact-rag (or lastn): it compares next-token distributions over the
# same tokens at the same positions; those baselines show the model another, shorter prompt.
FIDELITY_METHODS = (
    "fidelity compares KVMem methods (retrieval, recency) with full context over the same "
    "tokens; compact-rag and lastn show the model another, shorter prompt, so there is no "
    "per-position distribution to compare"
)
_MAX_TURNS = 200


@dataclass(slots=True)
class ForcedTurn:
    """One teacher-forced step: the prompt and the continuation scored."""

    index: int
    prompt: list[int]
    query: PromptSpans | TokenSpan | None
    continuation: list[int]
    fact_turn: int


@dataclass(slots=True)
class TurnFidelity:
    method: Method
    turn: int
    prompt_tokens: int
    scored_tokens: int
    over_budget: bool
    mean_kl: float
    p99_kl: float
    max_kl: float
    top1_agreement: float
    coverage: float | None
    coverage_by_layer: dict[int, float] = field(default_factory=dict)
    stage_in_blocks: int = 0
    replayed_tokens: int = 0
    fact_turn: int = 0
    kl: list[float] = field(default_factory=list)  # per scored token
    profile: dict[str, float] = field(default_factory=dict)


@dataclass(slots=True)
class FidelitySummary:
    method: Method
    scope: str  # "all" turns, or "over_budget" turns only
    turns: int
    scored_tokens: int
    mean_kl: float | None
    p99_kl: float | None
    top1_agreement: float | None
    mean_coverage: float | None


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """float64 [n, n_vocab] log-probabilities of float logits [n, n_vocab]."""
    x = logits.astype(np.float64)  # [n, n_vocab]
    x -= x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def kl_divergence(ref_logits: np.ndarray, logits: np.ndarray) -> np.ndarray:
    """float64 [n]: KL(ref || test) per row of logits [n, n_vocab] (computed in float64)."""
    ref = log_softmax(ref_logits)  # [n, n_vocab]
    test = log_softmax(logits)  # [n, n_vocab]
    kl = (np.exp(ref) * (ref - test)).sum(axis=-1)  # [n]
    return np.maximum(kl, 0.0)


def forced_turns(
    engine: BenchEngine, seed: int, target_tokens: int, tool_size: int
) -> list[ForcedTurn]:
    """Turns of the seeded transcript, as many as keep prompt + answer within target_tokens."""
    renderer = make_renderer(engine)
    head, turns = build_transcript(seed, _MAX_TURNS, tool_size=tool_size)
    out: list[ForcedTurn] = []
    for t, turn in enumerate(turns):
        history = history_through(head, turns, t)
        prompt = renderer.render(history)
        continuation = renderer.reply_tokens(history, turn.answer, prompt)
        if len(prompt.tokens) + len(continuation) > target_tokens:
            break
        query = prompt.spans or prompt.query
        out.append(ForcedTurn(t, prompt.tokens, query, continuation, turn.fact_turn))
    if not out:
        raise ConfigError("--target-tokens", f"{target_tokens} tokens do not hold one turn")
    return out


def run_fidelity(
    factory: EngineFactory,
    methods: Sequence[Method],
    seed: int,
    target_tokens: int,
    tool_size: int,
    budget: int,
    cache_dir: str | None = None,
    cache_settings: dict[str, object] | None = None,
    bar: tqdm | None = None,  # a tqdm bar of the turns scored (kvmem-bench --progress-bar)
) -> tuple[list[ForcedTurn], list[TurnFidelity]]:
    reference = factory.open(Method.FULL)
    try:
        steps = forced_turns(reference, seed, target_tokens, tool_size)
        key = reference_key(cache_settings or {}, [(s.prompt, s.continuation) for s in steps])
        ref_logits = load_reference(cache_dir, key, len(steps))
        if ref_logits is None:
            ref_logits = []
            for step in steps:
                logits = reference.teacher_force(step.prompt, step.continuation, query=step.query)
                ref_logits.append(np.asarray(logits, dtype=np.float32))  # [n_cont, n_vocab]
                logger.info("reference turn %d: %d prompt tokens", step.index, len(step.prompt))
            save_reference(cache_dir, key, ref_logits)
    finally:
        reference.close()
    results: list[TurnFidelity] = []
    if bar is not None:
        bar.reset(total=len(steps) * len(methods))
    for method in methods:
        if not method.uses_kvmem:
            raise ConfigError("--methods", FIDELITY_METHODS)
        engine = factory.open(method)
        try:
            for step, ref in zip(steps, ref_logits, strict=True):
                logits = engine.teacher_force(step.prompt, step.continuation, query=step.query)
                results.append(_score_turn(engine, method, step, ref, logits, budget))
                if bar is not None:
                    bar.update()
                logger.info("%s turn %d: KL %.4f", method.value, step.index, results[-1].mean_kl)
        finally:
            engine.close()
    return steps, results


def _score_turn(
    engine: BenchEngine,
    method: Method,
    step: ForcedTurn,
    ref: np.ndarray,
    logits: np.ndarray,
    budget: int,
) -> TurnFidelity:
    kl = kl_divergence(ref, logits)  # [n_cont]
    agree = np.argmax(ref, axis=-1) == np.argmax(logits, axis=-1)  # [n_cont]
    session = engine.session
    cov = None
    geometry = getattr(engine, "key_geometry", None)
    if session.last_query is not None and geometry is not None:
        cov = window_coverage(session.last_query, session.store, geometry, session.last_plan)
    turn = engine.last_turn
    return TurnFidelity(
        method=method,
        turn=step.index,
        prompt_tokens=len(step.prompt),
        scored_tokens=int(kl.shape[0]),
        over_budget=len(step.prompt) > budget,
        mean_kl=float(kl.mean()),
        p99_kl=float(np.percentile(kl, 99)),
        max_kl=float(kl.max()),
        top1_agreement=float(agree.mean()),
        coverage=None if cov is None else cov.mean,
        coverage_by_layer={} if cov is None else cov.by_layer,
        stage_in_blocks=turn.stage_in_blocks,
        replayed_tokens=turn.replayed_tokens,
        fact_turn=step.fact_turn,
        kl=[float(v) for v in kl],
        profile=turn_profile(turn),
    )


def summarize(results: Sequence[TurnFidelity]) -> list[FidelitySummary]:
    """Overall numbers per method, over all turns and over the turns beyond the budget:
    mean KL, p99 KL and top-1 agreement over all scored tokens; coverage averaged over turns."""
    out = []
    for method in dict.fromkeys(r.method for r in results):
        for scope in ("all", "over_budget"):
            mine = [r for r in results if r.method is method and (scope == "all" or r.over_budget)]
            n = sum(r.scored_tokens for r in mine)
            if not mine or n == 0:
                out.append(FidelitySummary(method, scope, len(mine), 0, None, None, None, None))
                continue
            values = np.asarray([v for r in mine for v in r.kl], dtype=np.float64)  # [n]
            covs = [r.coverage for r in mine if r.coverage is not None]
            out.append(
                FidelitySummary(
                    method=method,
                    scope=scope,
                    turns=len(mine),
                    scored_tokens=n,
                    mean_kl=float(values.mean()),
                    p99_kl=float(np.percentile(values, 99)),
                    top1_agreement=sum(r.top1_agreement * r.scored_tokens for r in mine) / n,
                    mean_coverage=float(np.mean(covs)) if covs else None,
                )
            )
    return out


def tables(results: Sequence[TurnFidelity], summaries: Sequence[FidelitySummary]) -> str:
    methods = list(dict.fromkeys(r.method for r in results))
    turns = sorted({r.turn for r in results})
    by_key = {(r.method, r.turn): r for r in results}
    headers = ["turn", "prompt", "tokens"]
    for m in methods:
        headers += [f"{m.value} KL", f"{m.value} top1", f"{m.value} cov"]
    rows = []
    for t in turns:
        first = by_key[(methods[0], t)]
        row: list[object] = [t, first.prompt_tokens, first.scored_tokens]
        for m in methods:
            r = by_key[(m, t)]
            row += [r.mean_kl, r.top1_agreement, r.coverage]
        rows.append(row)
    per_turn = format_table(
        headers, rows, "fidelity per turn (KL(full || kvmem), nats; top-1 agreement; coverage)"
    )
    overall = format_table(
        ["method", "scope", "turns", "tokens", "mean KL", "p99 KL", "top1", "coverage"],
        [
            [
                s.method.value,
                s.scope,
                s.turns,
                s.scored_tokens,
                s.mean_kl,
                s.p99_kl,
                s.top1_agreement,
                s.mean_coverage,
            ]
            for s in summaries
        ],
        "fidelity overall",
    )
    return per_turn + "\n\n" + overall


def reference_settings(settings: BenchSettings) -> dict[str, object]:
    """What the full-context reference logits depend on (the reference cache's key)."""
    model = settings.model_path
    stat = os.stat(model) if model and os.path.exists(model) else None
    return {
        "model": model,
        "model_size": None if stat is None else stat.st_size,
        "model_mtime": None if stat is None else stat.st_mtime_ns,
        "n_ctx": settings.n_ctx,
        "n_batch": settings.n_batch,
        "n_ubatch": settings.n_ubatch,
        "cache_types": (settings.cache_types.k.label, settings.cache_types.v.label),
        "flash_attn": settings.flash_attn,
        "n_gpu_layers": settings.n_gpu_layers,
    }


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "fidelity", help="teacher-forced KL / top-1 / coverage vs full context"
    )
    add_engine_arguments(p, DEFAULT_METHODS)
    p.add_argument("--seed", type=strict_int, default=0)
    p.add_argument(
        "--target-tokens",
        type=strict_int,
        default=None,
        help="longest prompt + answer (default: -c minus 256)",
    )
    p.add_argument("--tool-size", type=strict_int, default=12, help="lines/records per tool result")
    p.add_argument(
        "--reference-cache",
        default=None,
        metavar="DIR",
        help="keep the full-context reference logits here and reuse them across runs",
    )
    p.set_defaults(handler=run)


def run(ns: argparse.Namespace) -> int:
    settings = settings_from_args(ns)
    methods = parse_methods(ns.methods)
    target = ns.target_tokens or settings.n_ctx - 256
    if target >= settings.n_ctx:
        raise ConfigError("--target-tokens", f"must be below -c {settings.n_ctx}")
    t0 = time.perf_counter()
    with stderr_bar(ns.progress_bar, desc="fidelity", unit="turn") as bar:
        steps, results = run_fidelity(
            LlamaEngineFactory(settings),
            methods,
            ns.seed,
            target,
            ns.tool_size,
            settings.kvmem.budget,
            cache_dir=ns.reference_cache,
            cache_settings=reference_settings(settings),
            bar=bar,
        )
    summaries = summarize(results)
    print(tables(results, summaries))
    payload = {
        "command": "fidelity",
        "settings": settings.describe()
        | {"seed": ns.seed, "target_tokens": target, "tool_size": ns.tool_size},
        "machine": machine_description(),
        "transcript": {
            "turns": len(steps),
            "final_prompt_tokens": len(steps[-1].prompt),
            "scored_tokens": sum(len(s.continuation) for s in steps),
        },
        "overall": summaries,
        "turns": results,
        "seconds": time.perf_counter() - t0,
    }
    path = write_json(ns.out, "fidelity.json", payload)
    if path is not None:
        print(f"\nwrote {path}")
    return 0
