"""Prompt-lookup drafts (--spec-type ngram-simple) in the session's generate loop on SmolLM2:
greedy output is token for token the output without drafts, under budget and over budget
(reselection, stream eviction and the generation ring spill), with drafts accepted."""

from __future__ import annotations

import dataclasses
import io

import pytest

from kvmem.config import KVMemConfig
from kvmem.engine.engine import Engine
from kvmem.spec_config import SpecConfig, SpecType

from .helpers import GREEDY, filler_tokens

pytestmark = pytest.mark.slow

CODE = (
    "def area(width, height):\n    return width * height\n\n"
    "def perimeter(width, height):\n    return 2 * (width + height)\n\n"
    "def describe(width, height):\n"
    "    return f'{width}x{height}: area {area(width, height)}'\n"
)
ASK = "\nRewrite the file above with the same code, unchanged:\n"
NGRAM = SpecConfig(type=SpecType.NGRAM, n_max=3, gate=False)  # every step drafts


def _settings(path: str, kvmem: KVMemConfig):
    from kvmem.config import KVCacheTypes
    from kvmem.engine_settings import EngineSettings

    return EngineSettings(
        model_path=path,
        n_ctx=4096,
        n_batch=512,
        n_ubatch=128,
        # one thread for single-token decodes: llama.cpp's CPU flash attention splits the KV
        # over the threads for one query row once the cache has >= 512 cells, which rounds
        # differently from the batched kernel that verifies drafts (docs/server.md)
        n_threads=1,
        n_threads_batch=2,
        cache_types=KVCacheTypes.from_names("f16", "f16"),
        kvmem=kvmem,
    )


def code_prompt(engine: Engine, n_filler: int) -> list[int]:
    head = (
        filler_tokens(engine, n_filler, seed=5)
        if n_filler
        else engine.tokenize("", add_special=True)
    )
    return head + engine.tokenize("File util.py:\n" + CODE + ASK + CODE[:24])


@pytest.mark.parametrize(
    ("budget", "reserve", "n_filler", "n_new"),
    [(2048, 256, 0, 40), (256, 64, 300, 120)],
    ids=["under-budget", "over-budget-spill"],
)
def test_ngram_drafts_keep_greedy_output(smollm2_path, budget, reserve, n_filler, n_new) -> None:
    kvmem = KVMemConfig(
        budget=budget,
        gen_reserve=reserve,
        block_tokens=32,
        sink_blocks=1,
        recent_blocks=1,
        trace=True,
    )
    trace = io.StringIO()
    plain = _engine(smollm2_path, kvmem, None)
    drafted = _engine(smollm2_path, kvmem, NGRAM, trace)
    try:
        prompt = code_prompt(plain, n_filler)
        want = list(plain.generate(prompt, sampling=GREEDY, max_tokens=n_new, ignore_eos=True))
        got = list(drafted.generate(prompt, sampling=GREEDY, max_tokens=n_new, ignore_eos=True))
        assert got == want
        st, ref = drafted.last_turn, plain.last_turn
        assert st.generated_tokens == n_new and st.draft_n_accepted > n_new // 3
        assert 0 < st.draft_n_accepted <= st.draft_n
        assert drafted.stats.draft_n == st.draft_n
        assert f"draft_n={st.draft_n} draft_accepted={st.draft_n_accepted}" in trace.getvalue()
        assert (st.spilled_blocks, st.evicted_blocks) == (ref.spilled_blocks, ref.evicted_blocks)
        assert drafted.session.window.peak_cells <= budget + reserve
        if n_filler:  # reselection moved blocks in, and the reserve spilled
            assert st.stage_in_blocks > 0 and st.spilled_blocks >= 1
            assert st.harvested_blocks == ref.harvested_blocks
        # only accepted tokens were recorded and harvested: the history equals plain's
        assert drafted.session.tokens == plain.session.tokens
        s_d, s_p = drafted.session.store, plain.session.store
        assert s_d.block_ids() == s_p.block_ids()
        for b in s_d.block_ids():
            assert all((x == y).all() for x, y in zip(s_d.get(b).k, s_p.get(b).k, strict=True))
    finally:
        plain.close()
        drafted.close()


def _engine(path: str, kvmem: KVMemConfig, spec: SpecConfig | None, trace=None) -> Engine:
    settings = _settings(path, kvmem)
    if spec is not None:
        settings = dataclasses.replace(settings, spec=spec)
    return Engine(settings, trace_stream=trace)
