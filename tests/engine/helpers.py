"""Helpers for engine tests: small real contexts on SmolLM2 (CPU)."""

from __future__ import annotations

import io

from kvmem.config import KVCacheTypes, KVMemConfig
from kvmem.engine.engine import Engine
from kvmem.engine_settings import EngineSettings
from kvmem.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0)

FILLER = (
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
)


# The tiny models' over-budget config: 32-token blocks in a 128-token budget, with a
# 2-block (budget/2) prefill stream, so a prefill leaves blocks for reselections to restore
TINY_OVER = KVMemConfig(
    budget=128,
    gen_reserve=64,
    block_tokens=32,
    sink_blocks=1,
    recent_blocks=1,
    stream_tokens=64,
    trace=True,
)


def make_engine(
    path: str,
    *,
    n_ctx: int = 2048,
    kvmem: KVMemConfig | None = None,
    cache: str = "f16",
    n_batch: int = 512,
    n_ubatch: int = 128,
    trace: io.StringIO | None = None,
    flash_attn: bool = True,
    warmup: bool = False,
) -> Engine:
    settings = EngineSettings(
        model_path=path,
        n_ctx=n_ctx,
        n_batch=n_batch,
        n_ubatch=n_ubatch,
        n_threads=2,
        cache_types=KVCacheTypes.from_names(cache, cache),
        kvmem=kvmem or KVMemConfig(budget=4096, gen_reserve=512),
        flash_attn=flash_attn,
        warmup=warmup,
    )
    return Engine(settings, trace_stream=trace)


def filler_tokens(engine: Engine, n_tokens: int, seed: int = 0) -> list[int]:
    """A deterministic haystack of exactly n_tokens tokens (BOS first)."""
    import random

    rng = random.Random(seed)
    sentences = FILLER.split(". ")
    text = ""
    tokens: list[int] = []
    while len(tokens) < n_tokens:
        text += rng.choice(sentences).strip(". ") + ". "
        tokens = engine.tokenize(text, add_special=True)
    return tokens[:n_tokens]
