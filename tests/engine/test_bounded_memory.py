"""The context never holds more than budget + reserve cells while the history grows."""

from __future__ import annotations

import io

import numpy as np
import pytest

from kvmem.config import KVMemConfig
from kvmem.engine.llama.batch_rows import MAIN_SEQ
from kvmem.engine.transfer.state_codec import parse_state

from .helpers import GREEDY, filler_tokens, make_engine

BUDGET, RESERVE = 1024, 256


def _cells_in_llama(engine) -> np.ndarray:
    """Positions of the main sequence's cells, read back from llama.cpp itself."""
    return parse_state(engine.session.ctx.get_state(MAIN_SEQ)).positions


@pytest.fixture(scope="module")
def bounded(smollm2_path):
    trace = io.StringIO()
    engine = make_engine(
        smollm2_path,
        n_ctx=8192,
        kvmem=KVMemConfig(budget=BUDGET, gen_reserve=RESERVE, trace=True),
        trace=trace,
    )
    yield engine, trace
    engine.close()


def test_long_prompt_and_generation_stay_in_budget(bounded):
    engine, trace = bounded
    session = engine.session
    assert session.capacity == BUDGET + RESERVE
    prompt = filler_tokens(engine, 5000, seed=1)
    observed = []
    for i, _ in enumerate(
        engine.generate(prompt, sampling=GREEDY, max_tokens=300, ignore_eos=True)
    ):
        if i % 50 == 0:
            observed.append(len(_cells_in_llama(engine)))
    assert engine.last_turn.generated_tokens == 300
    cells = _cells_in_llama(engine)
    observed.append(len(cells))
    assert max(observed) <= BUDGET + RESERVE
    assert session.window.peak_cells <= BUDGET + RESERVE
    assert len(cells) == session.window.cells_used()
    # the host store holds every complete block; the open tail is on the GPU
    n = session.table.n_tokens
    assert n == 5000 + 299
    bt = session.table.block_tokens
    assert session.store.block_ids() == tuple(range(n // bt))
    stored = sum(len(session.store.get(b).positions) for b in session.store.block_ids())
    open_tail = set(range(n // bt * bt, n))
    assert open_tail <= set(cells.tolist())
    assert stored + len(open_tail) == n
    # positions on the GPU are exactly the window: sink + selected blocks + tail, where the
    # layout put them (compact, the default: contiguous, ending at the open tail)
    gpu = set(cells.tolist())
    for b in session.table.gpu_blocks():
        start = session.window.start(b)
        assert set(range(start, start + bt)) <= gpu
    assert 0 in session.table.gpu_blocks()  # the sink block
    assert sorted(gpu) == list(range(n - len(cells), n))
    records = trace.getvalue()
    assert "KVMEM_STREAM" in records and "KVMEM_RESELECT" in records
