"""`--kvmem-recompute retrieved`: every retrieved block is decoded again in the chosen
window. Its V at layer 0 (a function of the token alone) stays the stream's; its V at the
last layer (which saw the text before it) changes; every block not retrieved keeps the
stream's KV bit for bit."""

from __future__ import annotations

import io
from dataclasses import replace

import numpy as np
import pytest

from kvmem.config import CellOrder, KVMemConfig, RecomputeMode
from kvmem.engine.llama.batch_rows import HARVEST_SEQ, MAIN_SEQ
from kvmem.engine.session import recompute
from kvmem.engine.session.recompute import (
    RecomputePlan,
    RecomputeRetrieved,
    RecomputeRun,
    runs_of,
    window_recompute,
)
from kvmem.engine.session.reselection import Reselection
from kvmem.engine.transfer.state_codec import parse_state, split_blocks
from kvmem.errors import ConfigError
from kvmem.memory.layout import PositionMode
from kvmem.memory.planner import Tier
from kvmem.memory.spans import TokenSpan

from .helpers import GREEDY, filler_tokens, make_engine

pytestmark = [pytest.mark.llama, pytest.mark.model]

BT = 128


@pytest.fixture(scope="module")
def engine(smollm2_path):
    kv = KVMemConfig(
        budget=1024,
        gen_reserve=256,
        recompute=RecomputeMode.RETRIEVED,
        recompute_above=0.0,  # at every reselection: the 2,500-token turn is 2.4 budgets
        trace=True,
    )
    made = make_engine(smollm2_path, n_ctx=4096, kvmem=kv, trace=io.StringIO())
    yield made
    made.close()


def _records(engine, kind: str) -> list[dict[str, str]]:
    lines = engine.tracer.stream.getvalue().splitlines()
    return [dict(kv.split("=", 1) for kv in ln.split()[1:]) for ln in lines if ln.startswith(kind)]


def _gpu_v(engine, block: int) -> list[np.ndarray]:
    """The V rows of `block`'s cells on the GPU now, per layer (read through the harvest
    sequence, as a harvest does)."""
    ctx, start = engine.session.ctx, engine.session.window.start(block)
    ctx.seq_cp(MAIN_SEQ, HARVEST_SEQ, start, start + BT)
    try:
        state = parse_state(bytes(ctx.get_state(HARVEST_SEQ)))
    finally:
        ctx.seq_rm(HARVEST_SEQ, -1, -1)
    (got,) = split_blocks(state, BT)
    return got.v


def _turn(engine) -> None:
    prompt = filler_tokens(engine, 2500, seed=7)
    engine.reset()
    engine.tracer.stream.seek(0)
    engine.tracer.stream.truncate()
    span = TokenSpan(len(prompt) - 30, len(prompt))
    list(engine.generate(prompt, query=span, sampling=GREEDY, max_tokens=1, ignore_eos=True))


def test_retrieved_blocks_are_computed_again_in_the_window(engine):
    _turn(engine)
    plan = engine.session.last_plan
    (reselect,) = _records(engine, "KVMEM_RESELECT")
    (recompute,) = _records(engine, "KVMEM_RECOMPUTE")
    retrieved = sorted(plan.retrieved)
    assert retrieved and reselect["retrieved"] == ",".join(map(str, retrieved))
    assert recompute["blocks"] == reselect["retrieved"] and recompute["skipped"] == "-"
    starts = [engine.session.window.start(b) for b in retrieved]
    cuts = sum(1 for a, b in zip(starts, starts[1:], strict=False) if b != a + BT)
    assert int(recompute["runs"]) == 1 + cuts < len(retrieved)  # some blocks share a batch
    assert int(recompute["tokens"]) == BT * len(retrieved)
    assert engine.last_turn.recomputed_tokens == BT * len(retrieved)
    store = engine.session.store
    for b in retrieved:
        gpu, host = _gpu_v(engine, b), store.get(b).v
        assert np.array_equal(gpu[0], host[0])  # layer 0: the tokens alone
        assert not np.array_equal(gpu[-1], host[-1])  # it saw the window, not the stream
    for b in plan.sink + plan.tier(Tier.RECENT):
        gpu, host = _gpu_v(engine, b), store.get(b).v
        assert len(gpu) == len(host) and all(map(np.array_equal, gpu, host))


def test_recompute_needs_the_compact_layout_and_the_free_order():
    with pytest.raises(ConfigError, match="--kvmem-positions compact"):
        KVMemConfig(recompute=RecomputeMode.RETRIEVED, positions=PositionMode.GATHER).validate()
    with pytest.raises(ConfigError, match="canonical"):
        KVMemConfig(recompute=RecomputeMode.RETRIEVED, cell_order=CellOrder.CANONICAL).validate()


def test_a_run_decoded_as_one_batch_matches_it_decoded_block_by_block(engine, monkeypatch):
    """The batch's causal mask gives a run's block what the block-by-block decode gives
    it: the run's blocks before it, already computed again (the same bytes on the CPU)."""
    _turn(engine)
    retrieved = sorted(engine.session.last_plan.retrieved)
    batched = {b: _gpu_v(engine, b)[-1] for b in retrieved}
    monkeypatch.setattr(
        recompute,
        "runs_of",
        lambda blocks, starts, bt: tuple(
            RecomputeRun(s, (b,)) for b, s in zip(blocks, starts, strict=True)
        ),
    )
    _turn(engine)
    (record,) = _records(engine, "KVMEM_RECOMPUTE")
    assert sorted(engine.session.last_plan.retrieved) == retrieved  # the same blocks again
    assert int(record["runs"]) == len(retrieved)
    for b in retrieved:
        assert np.array_equal(_gpu_v(engine, b)[-1], batched[b])  # bit for bit on the CPU


def test_runs_cut_where_a_block_does_not_follow_the_one_before():
    runs = runs_of([4, 9, 2, 30, 31], [256, 384, 512, 768, 896], 128)
    assert runs == (
        RecomputeRun(256, (4, 9, 2)),
        RecomputeRun(768, (30, 31)),
    )
    assert RecomputePlan(runs).blocks == (4, 9, 2, 30, 31)
    assert runs_of([], [], 128) == ()


def test_a_history_within_the_ratio_keeps_the_streams_kv(engine):
    """`--kvmem-recompute-above R`: no block is decoded again while the history is at most
    R budgets (min_history tokens); one token more and every retrieved block is."""
    _turn(engine)
    session = engine.session
    plan, table = session.last_plan, session.table
    retrieved = sorted(plan.retrieved)
    res = Reselection(plan, {b: session.window.start(b) for b in plan.selected}, None)

    def planned(min_history: int) -> RecomputePlan:
        return RecomputeRetrieved(session.ctx, table, engine.tracer, min_history).plan(res)

    assert planned(table.n_tokens) == RecomputePlan()
    assert planned(table.n_tokens - 1).blocks == tuple(retrieved)
    made = window_recompute(
        replace(KVMemConfig(), recompute=RecomputeMode.RETRIEVED, budget=800),
        session.ctx,
        table,
        engine.tracer,
    )
    assert isinstance(made, RecomputeRetrieved) and made.min_history == 2400  # 3 x 800
