"""Under budget KVMem is invisible: logits bit-identical to plain llama.cpp."""

from __future__ import annotations

import numpy as np
import pytest

from kvmem.config import KVMemConfig

from .helpers import GREEDY, filler_tokens, make_engine


@pytest.fixture(scope="module")
def engines(smollm2_path):
    kvmem = make_engine(smollm2_path, kvmem=KVMemConfig(budget=4096, gen_reserve=512))
    plain = make_engine(smollm2_path, kvmem=KVMemConfig(enabled=False))
    yield kvmem, plain
    kvmem.close()
    plain.close()


def _three_turns(engine, base: list[int]) -> tuple[list[list[int]], list[np.ndarray]]:
    prompt = list(base[:300])
    outputs, logits = [], []
    for turn in range(3):
        rows: list[np.ndarray] = []
        out = list(engine.generate(prompt, sampling=GREEDY, max_tokens=24, logits_out=rows))
        outputs.append(out)
        logits += rows
        prompt = prompt + out + list(base[300 + 150 * turn : 450 + 150 * turn])
    return outputs, logits


def test_three_turn_logits_bit_identical(engines, smollm2_path):
    kvmem, plain = engines
    base = filler_tokens(kvmem, 800, seed=3)
    out_k, logits_k = _three_turns(kvmem, base)
    out_p, logits_p = _three_turns(plain, base)
    assert out_k == out_p
    assert len(logits_k) == len(logits_p) > 30
    for a, b in zip(logits_k, logits_p, strict=True):
        assert np.array_equal(a, b)
    # KVMem really ran: blocks were harvested to the host, and turn 2/3 reused history
    assert len(kvmem.session.store) == kvmem.session.table.n_complete_blocks > 0
    assert kvmem.last_turn.cached_tokens > 300
