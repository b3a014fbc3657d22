"""A harvested and restored block gives the logits of never having evicted it."""

from __future__ import annotations

import numpy as np
import pytest

from kvmem.config import KVMemConfig
from kvmem.engine.trace import TurnStats

from .helpers import filler_tokens, make_engine


def _next_logits(engine, prompt, token, block_action) -> np.ndarray:
    """Prefill `prompt`, apply block_action to the session, then decode `token` directly."""
    engine.reset()
    engine.teacher_force(prompt, [token])
    block_action(engine.session)
    engine.session.ctx.decode([token], len(prompt), [True])
    return engine.session.ctx.logits(-1)


@pytest.mark.parametrize("cache", ["f16", "q8_0", "q4_0"])
def test_evict_restore_is_exact(smollm2_path, cache):
    engine = make_engine(smollm2_path, cache=cache, kvmem=KVMemConfig(budget=2048, gen_reserve=256))
    try:
        tokens = filler_tokens(engine, 3 * 128 + 40, seed=7)
        prompt, token = tokens[:-1], tokens[-1]

        def untouched(session):
            assert session.table.is_in_host(1) and session.table.is_on_gpu(1)

        def evict_restore(session):
            session.window.evict([1])
            assert not session.table.is_on_gpu(1)
            stats = TurnStats()
            stats.add(session.window.restore({1: 128}))
            assert stats.stage_in_blocks == 1
            assert stats.stage_in_bytes == session.store.get(1).nbytes
            assert session.table.is_on_gpu(1)

        def evict_only(session):
            session.window.evict([1])

        reference = _next_logits(engine, prompt, token, untouched)
        restored = _next_logits(engine, prompt, token, evict_restore)
        missing = _next_logits(engine, prompt, token, evict_only)
        assert np.array_equal(restored, reference)
        assert not np.array_equal(missing, reference)
    finally:
        engine.close()


def test_restore_several_blocks_in_one_call(smollm2_path):
    engine = make_engine(smollm2_path, kvmem=KVMemConfig(budget=2048, gen_reserve=256))
    try:
        tokens = filler_tokens(engine, 5 * 128 + 10, seed=9)
        prompt, token = tokens[:-1], tokens[-1]
        reference = _next_logits(engine, prompt, token, lambda s: None)

        def shuffle(session):
            session.window.evict([1, 2, 3])
            assert session.table.gpu_blocks() == (0, 4)
            stats = TurnStats()
            stats.add(session.window.restore({3: 384, 1: 128, 2: 256}))
            assert stats.stage_in_blocks == 3
            assert session.table.gpu_blocks() == (0, 1, 2, 3, 4)

        assert np.array_equal(_next_logits(engine, prompt, token, shuffle), reference)
    finally:
        engine.close()
