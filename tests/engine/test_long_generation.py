"""A generation longer than the reserve completes by spilling its oldest blocks."""

from __future__ import annotations

import io

from kvmem.config import KVMemConfig

from .helpers import GREEDY, filler_tokens, make_engine


def test_generation_longer_than_reserve(smollm2_path):
    trace = io.StringIO()
    engine = make_engine(
        smollm2_path,
        n_ctx=8192,
        kvmem=KVMemConfig(budget=1024, gen_reserve=256, trace=True),
        trace=trace,
    )
    try:
        prompt = filler_tokens(engine, 900, seed=2)
        out = list(engine.generate(prompt, sampling=GREEDY, max_tokens=600, ignore_eos=True))
        assert len(out) == 600
        stats = engine.last_turn
        assert stats.finish_reason == "length"
        assert stats.spilled_blocks >= 2
        assert "KVMEM_SPILL" in trace.getvalue()
        assert engine.session.window.peak_cells <= 1024 + 256
        # the spilled generation blocks are in the host store, nothing was lost
        n = engine.session.table.n_tokens
        assert engine.session.store.block_ids() == tuple(range(n // 128))
    finally:
        engine.close()
