"""Gathered positions: the context's cells sit exactly where the window layout says.

The check reads llama.cpp's own state of the main sequence (its cells' positions), so it
sees the seq_add moves, the restores at shifted positions and the truncations as llama.cpp
applied them, not as the session believes it did.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvmem.config import KVMemConfig
from kvmem.engine.llama.batch_rows import MAIN_SEQ
from kvmem.engine.session.window import TokenSpan
from kvmem.engine.transfer.state_codec import parse_state
from kvmem.memory.layout import PositionMode, head_run_end, window_layout

from .helpers import GREEDY, filler_tokens, make_engine

BT = 128


def context_positions(session) -> list[int]:
    state = parse_state(session.ctx.get_state(MAIN_SEQ))
    return sorted(state.positions.tolist())


def expected_positions(session) -> list[int]:
    """Every GPU block at its recorded start, and the open tail at its own positions."""
    t = session.table
    cells = [
        p
        for b in t.gpu_blocks()
        for p in range(session.window.start(b), session.window.start(b) + BT)
    ]
    cells += range(t.n_complete_blocks * BT, t.n_tokens)
    return sorted(cells)


@pytest.fixture(scope="module")
def engines(smollm2_path):
    made = {
        mode: make_engine(
            smollm2_path,
            n_ctx=4096,
            kvmem=KVMemConfig(budget=1024, gen_reserve=256, positions=mode),
        )
        for mode in PositionMode
    }
    yield made
    for engine in made.values():
        engine.close()


def _ask(engine, tokens: list[int], n_query: int = 40) -> list[int]:
    span = TokenSpan(len(tokens) - n_query, len(tokens))
    return list(engine.generate(tokens, query=span, sampling=GREEDY, max_tokens=6, ignore_eos=True))


def _long_turn(engine, seed: int) -> list[int]:
    """A fresh session asked about a 20-block prompt (over the 8-block budget)."""
    engine.reset()
    tokens = filler_tokens(engine, 20 * BT + 50, seed=seed)
    _ask(engine, tokens)
    return tokens


def test_gather_moves_retrieved_blocks_next_to_the_tail(engines):
    engine = engines[PositionMode.GATHER]
    _long_turn(engine, seed=21)
    session = engine.session
    plan = session.last_plan
    assert plan is not None and plan.retrieved
    n_complete = session.table.n_complete_blocks
    layout = window_layout(set(plan.selected), n_complete, BT, PositionMode.GATHER)
    gpu = session.table.gpu_blocks()
    # no generation spill at 6 tokens: the window is the plan
    assert set(gpu) == set(plan.selected)
    assert {b: session.window.start(b) for b in gpu} == layout
    assert session.window.moved == {b: p for b, p in layout.items() if p != b * BT}
    assert session.window.moved  # the retrieved blocks are not next to the tail
    positions = context_positions(session)
    assert positions == expected_positions(session)
    assert len(set(positions)) == len(positions)
    # the leading run (sink) stays put and nothing but it sits below the moved blocks
    head = head_run_end(set(plan.selected))
    assert head >= 1 and positions[: head * BT] == list(range(head * BT))
    assert min(session.window.moved.values()) == positions[head * BT]


def test_compact_lays_the_whole_window_in_contiguous_positions(engines):
    engine = engines[PositionMode.COMPACT]
    _long_turn(engine, seed=21)
    session = engine.session
    plan = session.last_plan
    assert plan is not None and plan.retrieved and plan.sink == (0,)
    layout = window_layout(
        set(plan.selected), session.table.n_complete_blocks, BT, PositionMode.COMPACT
    )
    assert {b: session.window.start(b) for b in session.table.gpu_blocks()} == layout
    assert session.window.moved[0] == layout[0] > 0  # the sink left position 0
    positions = context_positions(session)
    assert positions == expected_positions(session)
    n = session.table.n_tokens
    assert positions == list(range(n - len(positions), n))  # no gap, ending at the tail


def test_original_mode_never_moves_a_block(engines):
    engine = engines[PositionMode.ORIGINAL]
    _long_turn(engine, seed=21)
    session = engine.session
    assert session.window.moved == {}
    assert context_positions(session) == expected_positions(session)
    assert session.last_plan.retrieved


@pytest.mark.parametrize("mode", [PositionMode.GATHER, PositionMode.COMPACT])
def test_next_turns_relayout_and_an_edit_releases_moved_blocks(engines, mode):
    engine = engines[mode]
    engine.reset()
    base = filler_tokens(engine, 30 * BT, seed=22)
    turn1 = base[: 18 * BT + 30]
    out1 = _ask(engine, turn1)
    session = engine.session
    assert session.last_plan.retrieved
    # turn 2 appends: the layout is recomputed for the new tail run, cells stay consistent
    turn2 = turn1 + out1 + base[18 * BT + 30 : 24 * BT]
    out2 = _ask(engine, turn2)
    turn = engine.last_turn  # the replayed query and the answer saw the chosen window
    assert turn.cached_tokens + turn.reprocessed_tokens == len(turn1) + len(out1) - 1
    assert turn.reprocessed_tokens > 0
    assert context_positions(session) == expected_positions(session)
    # an edit inside the moved blocks' positions: they are released, the rest is rebuilt
    first_retrieved = session.last_plan.retrieved[0] * BT
    moved_at = min(session.window.moved.values(), default=first_retrieved)
    edited = list(turn2 + out2)
    cut = moved_at + 10
    edited[cut] = engine.tokenize(" purple")[0]
    _ask(engine, edited)
    assert engine.last_turn.cached_tokens == cut
    assert engine.last_turn.truncated_tokens == len(turn2 + out2) - 1 - cut
    positions = context_positions(session)
    assert positions == expected_positions(session)
    assert len(set(positions)) == len(positions)
    assert session.table.tokens[: len(edited)] == edited


@pytest.mark.parametrize("mode", [PositionMode.GATHER, PositionMode.COMPACT])
def test_a_short_prompt_after_a_gathered_turn_keeps_only_the_open_block(engines, mode):
    """A new conversation sharing 24 tokens: the cut block 0 stays open (and flagged on the
    GPU) while the reselection lays out no complete block at all."""
    engine = engines[mode]
    tokens = _long_turn(engine, seed=24)
    assert engine.session.window.moved
    short = tokens[:24] + filler_tokens(engine, 80, seed=25)[1:]
    out = _ask(engine, short, n_query=20)
    assert len(out) == 6 and engine.last_turn.cached_tokens == 24
    session = engine.session
    assert session.window.moved == {} and session.table.n_complete_blocks == 0
    assert context_positions(session) == list(range(session.table.n_tokens))


def test_gather_and_original_agree_when_everything_fits(engines):
    tokens = filler_tokens(engines[PositionMode.GATHER], 5 * BT + 20, seed=23)
    logits = {}
    for mode, engine in engines.items():
        engine.reset()
        logits[mode] = engine.teacher_force(tokens, tokens[-3:], query=TokenSpan(600, 660))
        assert engine.session.window.moved == {}
    assert np.array_equal(logits[PositionMode.GATHER], logits[PositionMode.ORIGINAL])
    assert np.array_equal(logits[PositionMode.COMPACT], logits[PositionMode.ORIGINAL])
