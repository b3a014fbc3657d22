"""`kvmem-bench decode-sweep`: decode and prefill tok/s against the logical context.

For every logical context L and configuration: fill the context with L - G random tokens
(timing the prefill), then decode G tokens greedily (timing the decode). Configurations:
`stock` (plain llama.cpp, full context of L), `kvmem` (KVMem with the budget, logical
context L) and optionally `offload` (plain llama.cpp with the KV cache in host memory,
offload_kqv=False). Stock is also measured at the window size (the budget), and every
decode rate is printed as a ratio against that figure from the same run.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from kvmem.bench.engines import GREEDY, BenchEngine, turn_profile
from kvmem.bench.report import format_table, machine_description, write_json
from kvmem.bench.transfer_report import transfer_table
from kvmem.cli.kvmem_flags import add_kv_cache_arguments, cache_types_from_args, strict_int
from kvmem.cli.progress_bar import stderr_bar
from kvmem.config import HARVEST_TOKENS, KVCacheTypes, KVMemConfig, QueryAheadMode, QuerySource
from kvmem.errors import ConfigError
from kvmem.memory.planner import RetrievalMethod
from kvmem.models import resolve_model_flag
from kvmem.settings.values import gpu_layers

logger = logging.getLogger(__name__)

_FIRST_TOKEN = 100  # random prompt tokens are drawn from [_FIRST_TOKEN, n_vocab)


class SweepConfig(Enum):
    STOCK = "stock"
    KVMEM = "kvmem"
    KVMEM_PYCB = "kvmem-pycb"  # KVMem with the eval callback in Python (no native gate)
    KVMEM_PLAIN = "kvmem-plain"  # KVMem without the reused (pinned) staging buffer
    KVMEM_NUMPY = "kvmem-numpy"  # KVMem with the numpy copy path (no native kv_copy)
    KVMEM_RECENCY = "kvmem-recency"  # KVMem recency: query capture on, no block index
    KVMEM_NOCB = "kvmem-nocb"  # KVMem recency without any eval callback on the context
    KVMEM_SCORING = "kvmem-scoring"  # KVMem with the query from the scoring context
    KVMEM_SCORING_AFTER = "kvmem-scoring-after"  # the same, query work after the prefill
    OFFLOAD = "offload"

    @property
    def is_kvmem(self) -> bool:
        return self in (
            SweepConfig.KVMEM,
            SweepConfig.KVMEM_PYCB,
            SweepConfig.KVMEM_PLAIN,
            SweepConfig.KVMEM_NUMPY,
            SweepConfig.KVMEM_RECENCY,
            SweepConfig.KVMEM_NOCB,
            SweepConfig.KVMEM_SCORING,
            SweepConfig.KVMEM_SCORING_AFTER,
        )

    @property
    def scoring(self) -> bool:
        """The query from the scoring context (`--kvmem-query-source scoring`)."""
        return self in (SweepConfig.KVMEM_SCORING, SweepConfig.KVMEM_SCORING_AFTER)

    @property
    def method(self) -> RetrievalMethod:
        recency = self in (SweepConfig.KVMEM_RECENCY, SweepConfig.KVMEM_NOCB)
        return RetrievalMethod.RECENCY if recency else RetrievalMethod.RETRIEVAL


@dataclass(frozen=True, slots=True)
class SweepPoint:
    config: SweepConfig
    context: int  # logical context reached: prompt + generated tokens
    window: bool = False  # the stock reference at the window size


@dataclass(slots=True)
class SweepResult:
    config: SweepConfig
    context: int
    window: bool
    prompt_tokens: int
    prefill_tok_s: float
    generated_tokens: int
    decode_tok_s: float
    turn_s: float = 0.0  # the generate call's wall time (its end harvests what still waits)
    decode_ratio_vs_window: float | None = None
    prefill_ratio_vs_window: float | None = None
    stage_in_blocks: int = 0
    host_store_bytes: int = 0
    gpu_cells_peak: int = 0
    profile: dict[str, float] = field(default_factory=dict)
    transfer: dict[str, dict[str, float | int | None]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SweepSettings:
    model_path: str
    contexts: tuple[int, ...]
    configs: tuple[SweepConfig, ...]
    budget: int
    gen_reserve: int
    gen_tokens: int
    cache_types: KVCacheTypes
    n_batch: int
    n_ubatch: int
    n_threads: int | None
    n_gpu_layers: int
    seed: int = 0
    block_tokens: int = 128
    harvest_tokens: int = HARVEST_TOKENS
    stream_tokens: int = -1  # as --kvmem-stream-tokens (-1: all the room a chunk leaves)

    def describe(self) -> dict[str, object]:
        return {
            "model": self.model_path,
            "contexts": list(self.contexts),
            "configs": [c.value for c in self.configs],
            "budget": self.budget,
            "gen_reserve": self.gen_reserve,
            "gen_tokens": self.gen_tokens,
            "cache_type_k": self.cache_types.k.label,
            "cache_type_v": self.cache_types.v.label,
            "n_batch": self.n_batch,
            "n_ubatch": self.n_ubatch,
            "threads": self.n_threads,
            "gpu_layers": self.n_gpu_layers,
            "seed": self.seed,
            "block_tokens": self.block_tokens,
            "harvest_tokens": self.harvest_tokens,
            "stream_tokens": self.stream_tokens,
        }

    def points(self) -> list[SweepPoint]:
        out = [SweepPoint(SweepConfig.STOCK, self.budget, window=True)]
        out += [SweepPoint(c, n) for c in self.configs for n in self.contexts]
        return out


def random_prompt(n_tokens: int, n_vocab: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return rng.integers(_FIRST_TOKEN, n_vocab, size=n_tokens, dtype=np.int64).tolist()


@dataclass(frozen=True, slots=True)
class Measured:
    """One generate call's speeds."""

    prefill_tok_s: float
    generated: int
    decode_tok_s: float
    turn_s: float  # the whole call: prefill, generation and the turn's end (its harvests)


def measure(engine: BenchEngine, prompt: Sequence[int], gen_tokens: int) -> Measured:
    """The speeds of one generate call, after a short warm-up generation (then forgotten
    with a reset). End-of-generation tokens are banned, so a real model decodes all
    `gen_tokens` as a random-weight one does."""
    for _ in engine.generate(prompt[:16], sampling=GREEDY, max_tokens=4):
        pass
    engine.reset()
    generated = 0
    t0 = time.perf_counter()
    for _ in engine.generate(prompt, sampling=GREEDY, max_tokens=gen_tokens, ignore_eos=True):
        generated += 1
    turn_s = time.perf_counter() - t0
    turn = engine.last_turn
    prefill = turn.prefill_tokens / (turn.prefill_ms / 1e3) if turn.prefill_ms > 0 else 0.0
    decode = turn.generated_tokens / (turn.decode_ms / 1e3) if turn.decode_ms > 0 else 0.0
    return Measured(prefill, generated, decode, turn_s)


def run_sweep(
    settings: SweepSettings,
    open_engine: Callable[[SweepPoint], BenchEngine],
    progress: Callable[[SweepResult], None] | None = None,
) -> list[SweepResult]:
    results = []
    for point in settings.points():
        engine = open_engine(point)
        try:
            n_prompt = point.context - settings.gen_tokens
            prompt = random_prompt(n_prompt, engine.info.n_vocab, settings.seed)
            got = measure(engine, prompt, settings.gen_tokens)
            stats = getattr(engine, "stats", None)
            result = SweepResult(
                config=point.config,
                context=point.context,
                window=point.window,
                prompt_tokens=n_prompt,
                prefill_tok_s=got.prefill_tok_s,
                generated_tokens=got.generated,
                decode_tok_s=got.decode_tok_s,
                turn_s=got.turn_s,
                stage_in_blocks=engine.last_turn.stage_in_blocks,
                host_store_bytes=getattr(stats, "host_store_bytes", 0),
                gpu_cells_peak=getattr(stats, "gpu_cells_peak", 0),
                profile=turn_profile(engine.last_turn),
                transfer=_transfer_profile(engine),
            )
            if got.generated < settings.gen_tokens:
                logger.warning(
                    "%s at %d: generation stopped after %d tokens",
                    point.config.value,
                    point.context,
                    got.generated,
                )
        finally:
            engine.close()
        results.append(result)
        if progress is not None:
            progress(result)
    add_ratios(results)
    return results


def _transfer_profile(engine: BenchEngine) -> dict[str, dict[str, float | int | None]]:
    read = getattr(engine, "transfer_profile", None)
    return read() if callable(read) else {}


def add_ratios(results: list[SweepResult]) -> None:
    ref = next((r for r in results if r.window), None)
    if ref is None or ref.decode_tok_s <= 0:
        return
    for r in results:
        r.decode_ratio_vs_window = r.decode_tok_s / ref.decode_tok_s
        r.prefill_ratio_vs_window = (
            r.prefill_tok_s / ref.prefill_tok_s if ref.prefill_tok_s > 0 else None
        )


def engine_opener(settings: SweepSettings) -> Callable[[SweepPoint], BenchEngine]:
    from kvmem.engine.engine import Engine
    from kvmem.engine_settings import STAGING_BYTES, EngineSettings

    def open_engine(point: SweepPoint) -> BenchEngine:
        kv = KVMemConfig(
            enabled=point.config.is_kvmem,
            budget=settings.budget,
            gen_reserve=settings.gen_reserve,
            block_tokens=settings.block_tokens,
            harvest_tokens=settings.harvest_tokens,
            stream_tokens=settings.stream_tokens,
            method=point.config.method,
            query_source=QuerySource.SCORING if point.config.scoring else QuerySource.MAIN,
            query_ahead=(
                QueryAheadMode.OFF
                if point.config is SweepConfig.KVMEM_SCORING_AFTER
                else QueryAheadMode.ON
            ),
        )
        n_ctx = point.context  # the prompt is context - gen_tokens: generation fills it exactly
        engine = Engine(
            EngineSettings(
                model_path=settings.model_path,
                n_ctx=n_ctx,
                n_batch=settings.n_batch,
                n_ubatch=settings.n_ubatch,
                n_threads=settings.n_threads,
                n_threads_batch=settings.n_threads,
                n_gpu_layers=settings.n_gpu_layers,
                flash_attn=True,
                offload_kqv=point.config is not SweepConfig.OFFLOAD,
                cache_types=settings.cache_types,
                kvmem=kv,
                seed=settings.seed,
                eval_gate=point.config is not SweepConfig.KVMEM_PYCB,
                query_capture=point.config is not SweepConfig.KVMEM_NOCB,
                staging_bytes=0 if point.config is SweepConfig.KVMEM_PLAIN else STAGING_BYTES,
            )
        )
        if point.config is SweepConfig.KVMEM_NUMPY:
            engine.session.transfer.native = None  # the fallback (as KVMEM_NATIVE_COPY=0)
        return engine

    return open_engine


def table(results: Sequence[SweepResult]) -> str:
    rows = [
        [
            ("stock@window" if r.window else r.config.value),
            r.context,
            r.prompt_tokens,
            r.prefill_tok_s,
            r.generated_tokens,
            r.decode_tok_s,
            r.decode_ratio_vs_window,
            r.prefill_ratio_vs_window,
            r.stage_in_blocks,
            r.turn_s,
        ]
        for r in results
    ]
    return format_table(
        [
            "config",
            "context",
            "prompt",
            "prefill tok/s",
            "gen",
            "decode tok/s",
            "decode / stock@window",
            "prefill / stock@window",
            "stage-in",
            "turn s",
        ],
        rows,
        "decode sweep",
    )


def _int_list(text: str, flag: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ConfigError(flag, f"invalid number list {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise ConfigError(flag, f"needs positive numbers, got {text!r}")
    return values


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("decode-sweep", help="decode/prefill tok/s vs logical context")
    p.add_argument(
        "-m",
        "--model",
        required=True,
        metavar="PATH.gguf|NAME",
        help="model, e.g. one written by `kvmem-bench synth-model`, or a name (qwen-0.5b)",
    )
    p.add_argument("--contexts", default="4096,32768,131072,262144")
    p.add_argument(
        "--configs",
        default="stock,kvmem",
        help="stock,kvmem,kvmem-pycb (eval callback in Python),kvmem-plain (no staging "
        "buffer),kvmem-numpy (numpy copy path, no native kv_copy),kvmem-recency (recency, "
        "query capture on),kvmem-nocb (recency, no eval callback on the context),kvmem-scoring "
        "(the query from the scoring context: no callback on the main one),kvmem-scoring-after "
        "(the same with --kvmem-query-ahead off),offload",
    )
    p.add_argument("--budget", type=strict_int, default=32768, help="KVMem budget (window size)")
    p.add_argument("--gen-reserve", type=strict_int, default=4096)
    p.add_argument("--gen-tokens", type=strict_int, default=128, help="decoded tokens per point")
    p.add_argument("--block-tokens", type=strict_int, default=128, help="KVMem block size")
    p.add_argument(
        "--harvest-tokens",
        type=strict_int,
        default=HARVEST_TOKENS,
        help="as --kvmem-harvest-tokens: harvest complete blocks once this many tokens wait",
    )
    p.add_argument(
        "--stream-tokens",
        type=strict_int,
        default=-1,
        help="as --kvmem-stream-tokens: the newest tokens a prefill chunk sees (-1: all the room)",
    )
    p.add_argument("-t", "--threads", type=strict_int, default=None)
    p.add_argument("-b", "--batch-size", type=strict_int, default=2048)
    p.add_argument("-ub", "--ubatch-size", type=strict_int, default=512)
    p.add_argument(
        "-ngl", "--gpu-layers", type=gpu_layers, default=-1, help="N, all or auto (default: all)"
    )
    p.add_argument("--seed", type=strict_int, default=0)
    p.add_argument("--out", default=None, metavar="DIR")
    add_kv_cache_arguments(p)
    p.set_defaults(handler=run)


def run(ns: argparse.Namespace) -> int:
    try:
        configs = tuple(SweepConfig(v.strip()) for v in ns.configs.split(",") if v.strip())
    except ValueError:
        raise ConfigError("--configs", f"invalid value in {ns.configs!r}") from None
    settings = SweepSettings(
        model_path=str(resolve_model_flag(ns.model, "-m")),
        contexts=_int_list(ns.contexts, "--contexts"),
        configs=configs,
        budget=ns.budget,
        gen_reserve=ns.gen_reserve,
        gen_tokens=ns.gen_tokens,
        cache_types=cache_types_from_args(ns),
        n_batch=ns.batch_size,
        n_ubatch=ns.ubatch_size,
        n_threads=ns.threads,
        n_gpu_layers=ns.gpu_layers,
        seed=ns.seed,
        block_tokens=ns.block_tokens,
        harvest_tokens=ns.harvest_tokens,
        stream_tokens=ns.stream_tokens,
    )
    KVMemConfig(
        budget=settings.budget,
        gen_reserve=settings.gen_reserve,
        block_tokens=settings.block_tokens,
        harvest_tokens=settings.harvest_tokens,
        stream_tokens=settings.stream_tokens,
    ).validate()
    if min(settings.contexts + (settings.budget,)) <= settings.gen_tokens:
        raise ConfigError("--gen-tokens", "every context must be larger than --gen-tokens")
    t0 = time.perf_counter()
    bar = stderr_bar(ns.progress_bar, total=len(settings.points()), desc="sweep", unit="case")

    def progress(r: SweepResult) -> None:
        bar.update()
        logger.info("%s", r)

    with bar:
        results = run_sweep(settings, engine_opener(settings), progress=progress)
    print(table(results))
    if any(r.transfer for r in results):
        print()
        print(transfer_table([(f"{r.config.value} {r.context}", r.transfer) for r in results]))
    payload = {
        "command": "decode-sweep",
        "settings": settings.describe(),
        "machine": machine_description(),
        "results": results,
        "seconds": time.perf_counter() - t0,
    }
    path = write_json(ns.out, "decode_sweep.json", payload)
    if path is not None:
        print(f"\nwrote {path}")
    return 0
