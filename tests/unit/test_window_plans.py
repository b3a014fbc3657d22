"""The window's stream, room and cut plans: pure, from the block table alone (no llama_cpp)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvmem.config import KVMemConfig
from kvmem.engine.session.window_plans import (
    NO_ROOM_NEEDED,
    FreshPrefill,
    StreamAt,
    fresh_cells,
    next_lay_restore,
    next_stream_stage_in,
    plan_cut,
    plan_room_for,
    plan_stream,
    planner_config,
)
from kvmem.errors import KVTransferError
from kvmem.memory.block_table import BlockTable
from kvmem.memory.kv_cells import KVCells
from kvmem.memory.spans import PromptSpans

BT = 16
CONFIG = KVMemConfig(block_tokens=BT, budget=64, stream_tokens=32)  # stream tier: 2 blocks
NO_SPANS = PromptSpans()


def _table(n_tokens: int, gpu: list[int], host: list[int] | None = None) -> BlockTable:
    table = BlockTable(BT)
    table.append(list(range(n_tokens)))
    table.mark_on_gpu(gpu)
    table.mark_in_host(range(table.n_complete_blocks) if host is None else host)
    return table


def test_stream_keeps_the_sink_and_the_newest_blocks() -> None:
    table = _table(164, gpu=[0, 1, 2, 3, 4, 5, 6, 7, 9, 10])
    plan = plan_stream(table, {}, CONFIG, StreamAt(160, NO_SPANS, room=64, grid=32))
    assert plan.position == 160
    assert plan.evict == (1, 2, 3, 4, 5, 6, 7)
    assert plan.stage_in == (8,)


def test_stream_restores_a_moved_block_at_its_own_positions() -> None:
    table = _table(164, gpu=[0, 8, 9, 10])
    plan = plan_stream(table, {9: 32}, CONFIG, StreamAt(160, NO_SPANS, room=64, grid=32))
    assert plan.evict == (9,)
    assert plan.stage_in == (9,)


def test_stream_mid_chunk_keeps_the_chunk_so_far() -> None:
    # position 176 is mid-chunk on a 32-token grid: the chunk started at 160 (block 10)
    table = _table(180, gpu=[0, 3, 8, 9, 10, 11])
    plan = plan_stream(table, {}, CONFIG, StreamAt(176, NO_SPANS, room=64, grid=32))
    assert plan.evict == (3,)
    assert plan.stage_in == ()


def test_stream_with_room_for_everything_keeps_every_block() -> None:
    table = _table(68, gpu=[1, 4])
    plan = plan_stream(table, {}, CONFIG, StreamAt(64, NO_SPANS, room=128, grid=32))
    assert plan.evict == ()
    assert plan.stage_in == (0, 2, 3)


@st.composite
def _next_turns(draw: st.DrawFn) -> tuple[BlockTable, dict[int, int], StreamAt]:
    """A history with some blocks on the GPU (some moved), and where a next turn goes on."""
    n = draw(st.integers(1, 300))
    complete = n // BT
    gpu = draw(st.lists(st.integers(0, max(complete - 1, 0)), unique=True)) if complete else []
    table = _table(n, gpu=gpu + ([complete] if n % BT else []))
    moved = {b: b * BT + BT for b in gpu if draw(st.booleans())}
    at = StreamAt(draw(st.integers(0, n)), NO_SPANS, draw(st.integers(0, 8)) * BT, 32)
    return table, moved, at


@settings(max_examples=300, deadline=None)
@given(_next_turns())
def test_the_next_turns_stream_stage_in_is_the_cut_then_the_stream_plan(case) -> None:
    """The prediction made at a turn's end equals what the next turn does: cut the history
    at the position (moved blocks leave the GPU), then plan its first chunk's stream."""
    table, moved, at = case
    predicted = next_stream_stage_in(table, moved, CONFIG, at)
    cut = plan_cut(table, moved, at.position, keep_window=False)
    table.mark_off_gpu(cut.evict)
    table.truncate(at.position)
    assert predicted == plan_stream(table, {}, CONFIG, at).stage_in


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 12), st.integers(0, 12), st.integers(1, 6))
def test_a_fresh_prefill_modelled_on_from_a_run_is_the_one_modelled_whole(a, b, room) -> None:
    """Chunks of 32 tokens: the cells at the later chunk start are the same whether the
    model starts at 0 or goes on from the earlier one, and the run it went on from stays."""
    first, last = sorted((a * 32, b * 32))
    fresh = FreshPrefill(NO_SPANS, room * BT, 32, 32, 8, 512)
    run = fresh_cells(CONFIG, fresh, first)
    before = run.cells.cells.pos.tolist()
    went_on, whole = fresh_cells(CONFIG, fresh, last, run), fresh_cells(CONFIG, fresh, last)
    assert went_on.position == whole.position == last
    assert went_on.cells.cells.pos.tolist() == whole.cells.cells.pos.tolist()
    assert went_on.cells.cells.head == whole.cells.cells.head
    assert went_on.cells.on_gpu == whole.cells.on_gpu
    assert run.position == first and run.cells.cells.pos.tolist() == before


def _cells(blocks: list[int]) -> KVCells:
    """Each block at its own positions, in this cell order from cell 0."""
    cells = KVCells.empty(256)
    for b in blocks:
        cells.place(np.arange(b * BT, (b + 1) * BT, dtype=np.int64), BT)
    return cells


def test_the_next_lay_is_the_cut_then_the_fresh_order_past_the_blocks_in_place() -> None:
    """Blocks 0, 1, 5, 6 in cells 0-63; the next turn goes on from 64 on fresh cells 0, 1,
    2, 3: the cut drops 5 and 6, blocks 0 and 1 stay where they are, 2 and 3 go in. With
    block 3 moved to block 1's positions, the cut evicts it and 1, 2, 3 go in after 0."""
    table = _table(112, gpu=[0, 1, 5, 6])
    assert next_lay_restore(table, {}, _cells([0, 1, 5, 6]), 64, [0, 1, 2, 3]) == (2, 3)
    moved = _cells([0, 3, 5, 6])
    moved.shift(0, 48, 64, -32)  # block 3's cells at positions 16-31
    table = _table(112, gpu=[0, 3, 5, 6])
    assert next_lay_restore(table, {3: 16}, moved, 64, [0, 1, 2, 3]) == (1, 2, 3)
    assert next_lay_restore(table, {}, None, 64, [0, 1, 2, 3]) == (0, 1, 2, 3)  # unknown


def test_room_not_needed_is_the_empty_choice() -> None:
    table = _table(164, gpu=list(range(11)))
    assert plan_room_for(table, 164, 200, 16, None, None, ()) is NO_ROOM_NEEDED
    assert NO_ROOM_NEEDED.victims == ()


def test_room_spills_this_generations_oldest_blocks_first() -> None:
    table = _table(164, gpu=list(range(11)))
    one = plan_room_for(table, 164, 170, 16, 100, None, ())
    assert (one.room.spilled, one.room.evicted, one.spill) == ((6,), (), True)
    three = plan_room_for(table, 164, 170, 40, 100, None, ())
    assert three.victims == (6, 7, 8)


def test_room_outside_generation_evicts_the_oldest_block() -> None:
    table = _table(164, gpu=list(range(11)))
    choice = plan_room_for(table, 164, 170, 16, None, None, ())
    assert (choice.room.spilled, choice.room.evicted, choice.spill) == ((), (0,), False)


def test_room_without_an_evictable_block_fails() -> None:
    table = _table(164, gpu=[9, 10])  # the newest complete block and the open one stay
    with pytest.raises(KVTransferError, match="cannot free 20 KV cells"):
        plan_room_for(table, 20, 20, 20, None, None, ())


def test_cut_evicts_moved_blocks_and_restores_the_partial_block() -> None:
    table = _table(164, gpu=[0, 1, 3, 9, 10])
    plan = plan_cut(table, {3: 100}, 40, keep_window=False)
    assert plan.evict == (3,)
    assert plan.restore == 2  # 40 is mid-block 2, which is in the host store only
    assert plan.dropped == (2, 3, 4, 5, 6, 7, 8, 9, 10)


def test_cut_restores_a_moved_partial_block_it_evicts() -> None:
    table = _table(164, gpu=[0, 1, 2, 9, 10])
    plan = plan_cut(table, {2: 16}, 40, keep_window=False)
    assert (plan.evict, plan.restore) == ((2,), 2)


def test_cut_on_a_block_boundary_restores_nothing() -> None:
    table = _table(164, gpu=[0, 1, 9, 10])
    plan = plan_cut(table, {}, 32, keep_window=False)
    assert (plan.evict, plan.restore, plan.dropped) == ((), None, tuple(range(2, 11)))


def test_cut_at_the_end_drops_nothing() -> None:
    table = _table(164, gpu=list(range(11)))
    plan = plan_cut(table, {}, 164, keep_window=False)
    assert (plan.evict, plan.restore, plan.dropped) == ((), None, ())


def test_replay_cut_keeps_moved_blocks_before_it() -> None:
    table = _table(164, gpu=[0, 1, 2, 9, 10])
    plan = plan_cut(table, {1: 0}, 120, keep_window=True)
    assert (plan.evict, plan.restore) == ((), 7)
    assert plan.dropped == (7, 8, 9, 10)


def test_replay_cut_refuses_a_moved_block_at_or_after_it() -> None:
    table = _table(164, gpu=[0, 1, 9, 10])
    with pytest.raises(KVTransferError, match="a moved block holds cells at or after 40"):
        plan_cut(table, {1: 32}, 40, keep_window=True)


def test_planner_config_carries_the_retrieval_settings() -> None:
    config = planner_config(KVMemConfig(block_tokens=BT, budget=64, neighbor_blocks=2))
    assert (config.neighbor_blocks, config.budget_tokens, config.block_tokens) == (2, 64, BT)
    assert planner_config(CONFIG).neighbor_blocks == 0
