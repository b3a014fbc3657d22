"""The cells llama.cpp fills in a prefill over the budget are those memory/kv_cells.py
models (`fresh_cells`), chunk by chunk; a warm turn under `--kvmem-cell-order canonical`
starts on exactly those cells."""

from __future__ import annotations

import io
from dataclasses import replace

import pytest

from kvmem.config import CellOrder, KVMemConfig
from kvmem.engine.llama.batch_rows import MAIN_SEQ
from kvmem.engine.session.window import GpuWindow
from kvmem.engine.transfer.state_codec import parse_state
from kvmem.memory.spans import TokenSpan

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
        model = session.cell_order.fresh(session._spans, plan.position).layout().tolist()
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


def _cells_seen(ctx) -> list[int]:
    return parse_state(ctx.get_state(MAIN_SEQ)).positions.tolist()


def test_the_followed_cells_are_llama_cpps_and_a_turn_lays_only_what_differs(
    smollm2_path, monkeypatch
):
    """The cells the context follows (LlamaContext.cells) equal those llama.cpp holds at
    every prefill chunk and turn's end, through evictions, restores and moves. A warm turn
    keeps the blocks already in their fresh cells: under the budget all of them, over it
    those before the first that differs; then it holds exactly the fresh prefill's cells."""
    trace = io.StringIO()
    kv = KVMemConfig(budget=512, gen_reserve=256, cell_order=CellOrder.CANONICAL, trace=True)
    engine = make_engine(smollm2_path, n_ctx=8192, kvmem=kv, trace=trace)
    checked: list[tuple[int, list[int]]] = []  # (chunk start, the cells llama.cpp holds)
    apply_stream = GpuWindow.apply_stream

    def spy(window, plan):
        ctx = engine.session.ctx
        seen = _cells_seen(ctx)
        assert ctx.cells is not None and ctx.cells.layout().tolist() == seen
        checked.append((plan.position, seen))
        return apply_stream(window, plan)

    monkeypatch.setattr(GpuWindow, "apply_stream", spy)

    def turn(prompt: list[int]) -> tuple[list[int], str]:
        trace.seek(0)
        trace.truncate()
        query = TokenSpan(len(prompt) - 30, len(prompt))
        out = list(
            engine.generate(prompt, query=query, sampling=GREEDY, max_tokens=6, ignore_eos=True)
        )
        ctx = engine.session.ctx
        assert ctx.cells.layout().tolist() == _cells_seen(ctx)
        laid = [line for line in trace.getvalue().splitlines() if "KVMEM_CELLS_LAID" in line]
        return out, (laid[0] if laid else "")

    try:
        base = filler_tokens(engine, 2000, seed=11)
        engine.reset()
        small = list(base[:300])
        out, _ = turn(small)
        _, laid = turn(small + out + list(base[300:380]))  # under the budget
        assert "kept=2 evicted=0 restored=0 cleared=0" in laid
        big = list(base[:1400])
        out, _ = turn(big)
        assert engine.last_turn.evicted_blocks > 0  # the reselection changed the window
        follow = big + out + list(base[1400:1500])
        _, laid = turn(follow)
        kept = int(laid.split("kept=")[1].split()[0])
        restored = int(laid.split("restored=")[1].split()[0])
        start = engine.last_turn.cached_tokens
        order = engine.session.cell_order.order(engine.session._spans, start)
        assert "cleared=0" in laid and restored >= 1 and kept + restored == len(order)
        fresh = engine.session.cell_order.fresh(engine.session._spans, start).layout().tolist()
        assert checked[-1] == (start, fresh)  # the turn went on from the fresh cells
        assert len(checked) > 8
    finally:
        engine.close()


def test_conversations_sharing_a_context_follow_its_cells_and_answer_as_fresh(smollm2_path):
    """Two conversations over the budget on one context (`--kvmem-conversations 2`, the
    canonical order), alternating: after every turn the followed cells are llama.cpp's,
    and each answer is the one a fresh session gives the same prompt."""
    kv = KVMemConfig(budget=512, gen_reserve=256, cell_order=CellOrder.CANONICAL)
    pooled = make_engine(smollm2_path, n_ctx=8192, kvmem=replace(kv, conversations=2))
    fresh = make_engine(smollm2_path, n_ctx=8192, kvmem=kv)
    try:
        base = {c: filler_tokens(pooled, 1900, seed=s) for c, s in (("A", 21), ("B", 22))}
        history = {c: list(base[c][:900]) for c in base}
        for turn in range(2):
            for conv in ("A", "B"):
                prompt = history[conv]
                query = TokenSpan(len(prompt) - 30, len(prompt))
                out = list(
                    pooled.generate(
                        prompt, query=query, sampling=GREEDY, max_tokens=6, ignore_eos=True
                    )
                )
                ctx = pooled.session.ctx
                assert ctx.cells is not None and ctx.cells.layout().tolist() == _cells_seen(ctx)
                fresh.reset()
                alone = fresh.generate(
                    prompt, query=query, sampling=GREEDY, max_tokens=6, ignore_eos=True
                )
                assert out == list(alone), (conv, turn)
                history[conv] = (
                    prompt + out + list(base[conv][900 + 400 * turn : 1300 + 400 * turn])
                )
        assert pooled.stats.conversation_switches == 3
    finally:
        pooled.close()
        fresh.close()
