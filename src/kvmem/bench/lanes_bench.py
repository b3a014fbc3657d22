"""`kvmem-bench lanes`: aggregate decode tok/s of 1, 2, ... concurrent `--parallel` lanes.

One `EngineLanes` with the largest lane count loads the weights once; for each count N,
N client threads each generate `--gen-tokens` tokens (EOG banned, greedy) on their own
lane at the same time, each from its own short prompt. Aggregate decode tok/s = all
tokens generated / the wall time from the first lane's first token to the last lane's
last; the ratios to one lane are printed from the same run.

Then, on the same loaded weights and unless `--no-baseline`, the plain-llama.cpp baseline
(no KVMem, engine/llama/seq_baseline.py) of the two lane designs: N sequence ids batched in ONE
context (one llama_decode per step) against N contexts decoding on N threads, with the
ratio one-context / N-contexts from the same run.
"""

from __future__ import annotations

import argparse
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from kvmem.bench.report import format_table, machine_description, write_json
from kvmem.cli.kvmem_flags import add_kv_cache_arguments, cache_types_from_args, strict_int
from kvmem.cli.progress_bar import stderr_bar
from kvmem.config import KVMemConfig
from kvmem.engine_settings import MAX_LANES, EngineSettings
from kvmem.errors import ConfigError
from kvmem.models import resolve_model_flag
from kvmem.sampling import SamplingParams
from kvmem.settings.values import gpu_layers

if TYPE_CHECKING:
    from kvmem.engine.engine import Engine
    from kvmem.engine.lanes import EngineLanes

logger = logging.getLogger(__name__)

GREEDY = SamplingParams(temperature=0.0)
TOPICS = ("a lighthouse", "a copper mine", "a glacier", "a night market")


def _lane_counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ConfigError("--lanes", f"invalid list {text!r}") from None
    if not counts or any(not 1 <= n <= MAX_LANES for n in counts):
        raise ConfigError("--lanes", f"each count must be between 1 and {MAX_LANES}")
    return counts


def _prompt(engine: Engine, lane: int) -> list[int]:
    text = f"Write a long story about {TOPICS[lane % len(TOPICS)]}, chapter by chapter."
    return engine.tokenize(text, add_special=True)


def measure(lanes: EngineLanes, n: int, gen_tokens: int) -> dict[str, Any]:
    """N lanes generating at once; tok/s over the span of their decoding."""
    from kvmem.engine.llama.seq_baseline import run_threads

    first: list[float] = [0.0] * n
    last: list[float] = [0.0] * n
    counts: list[int] = [0] * n
    barrier = threading.Barrier(n)

    def client(i: int) -> None:
        engine = lanes.lanes[i]
        engine.reset()
        prompt = _prompt(engine, i)
        barrier.wait()
        for _ in engine.generate(prompt, sampling=GREEDY, max_tokens=gen_tokens, ignore_eos=True):
            now = time.perf_counter()
            if counts[i] == 0:
                first[i] = now
            counts[i] += 1
            last[i] = now

    run_threads(client, n, barrier)
    span = max(last) - min(first)
    total = sum(counts)
    per_lane = [
        lanes.lanes[i].last_turn.generated_tokens / (lanes.lanes[i].last_turn.decode_ms / 1e3)
        for i in range(n)
        if lanes.lanes[i].last_turn.decode_ms > 0
    ]
    return {
        "lanes": n,
        "tokens": total,
        "seconds": span,
        "aggregate_tok_s": total / span if span > 0 else 0.0,
        "per_lane_tok_s": per_lane,
    }


def measure_baseline(lanes: EngineLanes, counts: tuple[int, ...], gen: int) -> list[dict]:
    """For each N: plain llama.cpp, N seq ids in one context vs N contexts (no KVMem)."""
    from kvmem.engine.llama.seq_baseline import (
        agreeing_prefix,
        baseline_settings,
        n_contexts,
        one_context,
    )

    engine = lanes.lanes[0]
    prompts = [_prompt(engine, i) for i in range(max(counts))]
    settings = baseline_settings(engine.ctx.settings, max(len(p) for p in prompts) + gen)
    one_context(lanes.model, settings, prompts[:1], min(16, gen))  # warm-up
    rows = []
    for n in counts:
        one = one_context(lanes.model, settings, prompts[:n], gen)
        many = n_contexts(lanes.model, settings, prompts[:n], gen)
        rows.append(
            {
                "sequences": n,
                "tokens": one.tokens,
                "one_context_tok_s": one.tok_s,
                "n_contexts_tok_s": many.tok_s,
                "one_context_over_n_contexts": one.tok_s / many.tok_s if many.tok_s else None,
                "same_greedy_tokens": agreeing_prefix(one.outputs, many.outputs),
            }
        )
        logger.info(
            "baseline %d seqs: one context %.1f, %d contexts %.1f tok/s",
            n,
            one.tok_s,
            n,
            many.tok_s,
        )
    return rows


def baseline_table(rows: list[dict], gen: int) -> str:
    body = [
        [
            r["sequences"],
            f"{r['one_context_tok_s']:.1f}",
            f"{r['n_contexts_tok_s']:.1f}",
            "-"
            if r["one_context_over_n_contexts"] is None
            else f"{r['one_context_over_n_contexts']:.2f}x",
            r["same_greedy_tokens"],
        ]
        for r in rows
    ]
    return format_table(
        [
            "N",
            "1 context, N seq ids tok/s",
            "N contexts tok/s",
            "seq ids / contexts",
            "equal greedy tokens",
        ],
        body,
        title=f"plain llama.cpp, no KVMem: {gen} tokens per sequence",
    )


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("lanes", help="aggregate decode tok/s of concurrent --parallel lanes")
    p.add_argument("-m", "--model", required=True, metavar="PATH.gguf|NAME")
    p.add_argument("--lanes", default="1,2,4", help="lane counts to measure (default: 1,2,4)")
    p.add_argument("--gen-tokens", type=strict_int, default=256, help="tokens per lane")
    p.add_argument("-c", "--ctx-size", type=strict_int, default=8192)
    p.add_argument("--budget", type=strict_int, default=4096, help="KVMem budget per lane")
    p.add_argument("--gen-reserve", type=strict_int, default=512)
    p.add_argument("-t", "--threads", type=strict_int, default=None)
    p.add_argument(
        "-ngl", "--gpu-layers", type=gpu_layers, default=-1, help="N, all or auto (default: all)"
    )
    p.add_argument(
        "--no-baseline",
        dest="baseline",
        action="store_false",
        help="skip the plain-llama.cpp baseline (N seq ids in one context vs N contexts)",
    )
    p.add_argument("--out", default=None, metavar="DIR")
    add_kv_cache_arguments(p)
    p.set_defaults(handler=run)


def run(ns: argparse.Namespace) -> int:
    counts = _lane_counts(ns.lanes)
    settings = EngineSettings(
        model_path=str(resolve_model_flag(ns.model, "-m")),
        n_ctx=ns.ctx_size,
        n_threads=ns.threads,
        n_gpu_layers=ns.gpu_layers,
        cache_types=cache_types_from_args(ns),
        kvmem=KVMemConfig(budget=ns.budget, gen_reserve=ns.gen_reserve),
    )
    from kvmem.engine.lanes import EngineLanes  # loads llama.cpp

    t0 = time.perf_counter()
    lanes = EngineLanes(settings, max(counts))
    try:
        measure(lanes, 1, min(16, ns.gen_tokens))  # warm-up (graph allocation)
        results = []
        for n in stderr_bar(ns.progress_bar, iterable=counts, desc="lanes", unit="case"):
            results.append(measure(lanes, n, ns.gen_tokens))
            logger.info("%d lanes: %.1f tok/s", n, results[-1]["aggregate_tok_s"])
        baseline = measure_baseline(lanes, counts, ns.gen_tokens) if ns.baseline else []
    finally:
        lanes.close()
    base = next((r["aggregate_tok_s"] for r in results if r["lanes"] == 1), None)
    for r in results:
        r["ratio_to_1_lane"] = r["aggregate_tok_s"] / base if base else None
    rows = [
        [
            r["lanes"],
            r["tokens"],
            f"{r['seconds']:.2f}",
            f"{r['aggregate_tok_s']:.1f}",
            "-" if r["ratio_to_1_lane"] is None else f"{r['ratio_to_1_lane']:.2f}x",
        ]
        for r in results
    ]
    print(
        format_table(
            ["lanes", "tokens", "seconds", "aggregate tok/s", "vs 1 lane"],
            rows,
            title=f"concurrent lanes, {ns.gen_tokens} tokens each",
        )
    )
    if baseline:
        print()
        print(baseline_table(baseline, ns.gen_tokens))
    payload = {
        "command": "lanes",
        "settings": {
            "model": settings.model_path,
            "gen_tokens": ns.gen_tokens,
            "budget": ns.budget,
            "gen_reserve": ns.gen_reserve,
            "n_ctx": ns.ctx_size,
            "threads": ns.threads,
            "gpu_layers": ns.gpu_layers,
        },
        "machine": machine_description(),
        "results": results,
        "baseline_no_kvmem": baseline,
        "seconds": time.perf_counter() - t0,
    }
    path = write_json(ns.out, "lanes.json", payload)
    if path is not None:
        print(f"\nwrote {path}")
    return 0
