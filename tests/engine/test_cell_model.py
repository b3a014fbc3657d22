"""The cells llama.cpp fills in a prefill over the budget are those memory/kv_cells.py
models (`fresh_cells`), chunk by chunk; a warm turn under `--kvmem-cell-order canonical`
starts on exactly those cells."""

from __future__ import annotations

import pytest

from kvmem.config import CellOrder, KVMemConfig
from kvmem.engine.llama.batch_rows import MAIN_SEQ
from kvmem.engine.session.window import GpuWindow
from kvmem.engine.session.window_plans import fresh_cells
from kvmem.engine.transfer.state_codec import parse_state

from .helpers import GREEDY, filler_tokens, make_engine

pytestmark = pytest.mark.slow


def test_a_prefill_fills_the_cells_the_model_says(smollm2_path, monkeypatch):
    kv = KVMemConfig(budget=512, gen_reserve=256, cell_order=CellOrder.CANONICAL)
    engine = make_engine(smollm2_path, n_ctx=8192, kvmem=kv)
    seen: list[tuple[int, list[int], list[int]]] = []  # (chunk start, cells, model)
    apply_stream = GpuWindow.apply_stream

    def spy(window, plan):
        session = engine.session
        got = parse_state(session.ctx.get_state(MAIN_SEQ)).positions.tolist()
        model = fresh_cells(session.config, session._fresh(), plan.position).layout().tolist()
        seen.append((plan.position, got, model))
        return apply_stream(window, plan)

    monkeypatch.setattr(GpuWindow, "apply_stream", spy)
    try:
        prompt = filler_tokens(engine, 1400, seed=7)
        engine.reset()
        list(engine.generate(prompt, sampling=GREEDY, max_tokens=4, ignore_eos=True))
        fresh = list(seen)
        assert [s[0] for s in fresh] == list(range(0, 1400, 256))
        assert all(got == model for _, got, model in fresh)
        # the stream window evicts from the middle: later chunks fill those cells
        assert any(got != sorted(got) for _, got, _ in fresh)
        seen.clear()
        list(engine.generate(prompt, sampling=GREEDY, max_tokens=4, ignore_eos=True))
        start, got, model = seen[0]
        assert engine.last_turn.cached_tokens == start > 0
        assert got == model == fresh[start // 256][1]  # the fresh prefill's cells there
    finally:
        engine.close()
