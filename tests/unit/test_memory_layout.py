"""Window layout: where each selected block sits, and the order of the moves."""

from __future__ import annotations

import random

import pytest

from kvmem.errors import MemoryLayoutError
from kvmem.memory.layout import (
    BlockMove,
    PositionMode,
    move_order,
    tail_run_start,
    window_layout,
)

BT = 128


def reference_layout(
    selected: set[int], n_complete: int, sink: int | None = None
) -> dict[int, int]:
    """Plain version: the runs at both ends stay, the rest packs below the tail run
    (`sink` 0: the leading run packs too)."""
    run = n_complete
    while run - 1 in selected:
        run -= 1
    if sink is None:
        sink = 0
        while sink in selected and sink < run:
            sink += 1
    out = {b: b * BT for b in selected if b < sink or b >= run}
    slot = run - 1
    for b in sorted((b for b in selected if sink <= b < run), reverse=True):
        out[b] = slot * BT
        slot -= 1
    return out


def test_tail_run_start() -> None:
    assert tail_run_start({0, 5, 8, 9}, 10) == 8
    assert tail_run_start({0, 5, 8}, 10) == 10  # block 9 is not selected: empty run
    assert tail_run_start(set(range(10)), 10) == 0
    assert tail_run_start(set(), 0) == 0


def test_gather_puts_retrieved_blocks_right_before_the_tail_run() -> None:
    # sink 0, retrieved 3 and 7, recent run 44..46 of 47 complete blocks
    starts = window_layout({0, 3, 7, 44, 45, 46}, 47, BT, PositionMode.GATHER)
    assert starts == {0: 0, 3: 42 * BT, 7: 43 * BT, 44: 44 * BT, 45: 45 * BT, 46: 46 * BT}


def test_original_keeps_every_block_at_its_own_positions() -> None:
    starts = window_layout({0, 3, 7, 44, 45, 46}, 47, BT, PositionMode.ORIGINAL)
    assert starts == {b: b * BT for b in (0, 3, 7, 44, 45, 46)}


def test_gather_without_gaps_moves_nothing() -> None:
    assert window_layout(set(range(12)), 12, BT, PositionMode.GATHER) == {
        b: b * BT for b in range(12)
    }
    # the run that starts the conversation (sink and control text) stays where it is
    starts = window_layout({0, 1, 2, 5, 9}, 10, BT, PositionMode.GATHER)
    assert starts == {0: 0, 1: BT, 2: 2 * BT, 5: 8 * BT, 9: 9 * BT}


def test_gather_without_block_zero_moves_every_block_before_the_tail_run() -> None:
    starts = window_layout({1, 4, 9}, 10, BT, PositionMode.GATHER)
    assert starts == {1: 7 * BT, 4: 8 * BT, 9: 9 * BT}


def test_layout_rejects_blocks_out_of_range() -> None:
    with pytest.raises(MemoryLayoutError):
        window_layout({0, 10}, 10, BT, PositionMode.GATHER)


@pytest.mark.parametrize(("mode", "sink"), [(PositionMode.GATHER, None), (PositionMode.COMPACT, 0)])
def test_layout_matches_the_reference_on_random_windows(mode: PositionMode, sink) -> None:
    rng = random.Random(3)
    for _ in range(300):
        n = rng.randint(1, 60)
        selected = set(rng.sample(range(n), rng.randint(0, n)))
        got = window_layout(selected, n, BT, mode)
        assert got == reference_layout(selected, n, sink)
        if sink == 0:  # compact: one run ending at the newest complete block
            assert sorted(got.values()) == [p * BT for p in range(n - len(selected), n)]
        assert len(set(got.values())) == len(got)  # no two blocks share positions
        order = sorted(got, key=got.get)
        assert order == sorted(got)  # chronological order is kept


def test_move_order_forward_moves_go_last_block_first() -> None:
    current = {3: 3 * BT, 4: 4 * BT, 9: 9 * BT}
    target = {3: 7 * BT, 4: 8 * BT, 9: 9 * BT}
    assert move_order(current, target, BT) == [
        BlockMove(4, 4 * BT, 8 * BT),
        BlockMove(3, 3 * BT, 7 * BT),
    ]


def test_move_order_chain_that_lands_on_a_block_moving_away() -> None:
    # 3 -> where 4 is; 4 moves on first
    current = {3: 3 * BT, 4: 4 * BT}
    target = {3: 4 * BT, 4: 5 * BT}
    assert move_order(current, target, BT) == [
        BlockMove(4, 4 * BT, 5 * BT),
        BlockMove(3, 3 * BT, 4 * BT),
    ]
    # and backwards: first block first
    back = move_order(target, current, BT)
    assert back == [BlockMove(3, 4 * BT, 3 * BT), BlockMove(4, 5 * BT, 4 * BT)]


def test_move_order_refuses_landing_on_a_block_that_stays() -> None:
    with pytest.raises(MemoryLayoutError, match="would land on block 5"):
        move_order({3: 3 * BT, 5: 5 * BT}, {3: 5 * BT, 5: 5 * BT}, BT)


def test_move_order_refuses_unaligned_moves() -> None:
    with pytest.raises(MemoryLayoutError, match="block-aligned"):
        move_order({3: 3 * BT}, {3: 3 * BT + 5}, BT)


def simulate(current: dict[int, int], moves: list[BlockMove]) -> dict[int, int]:
    """Apply the moves one by one as llama.cpp would: by position range."""
    pos = dict(current)
    for m in moves:
        hit = [b for b, p in pos.items() if p == m.src]
        assert hit == [m.block_id]
        assert all(p != m.dst for b, p in pos.items() if b != m.block_id)
        pos[m.block_id] = m.dst
    return pos


def test_relayouts_between_random_windows_never_collide() -> None:
    rng = random.Random(11)
    for _ in range(300):
        n = rng.randint(2, 50)
        first = set(rng.sample(range(n), rng.randint(1, n)))
        now = window_layout(first, n, BT, PositionMode.GATHER)
        # the next turn: more blocks, some of the old ones kept
        n2 = n + rng.randint(0, 6)
        kept = {b for b in first if rng.random() < 0.6}
        second = kept | set(rng.sample(range(n2), rng.randint(0, n2 // 2)))
        second |= set(range(n, n2))
        target = window_layout(second, n2, BT, PositionMode.GATHER)
        current = {b: now[b] for b in kept}
        moves = move_order(current, {b: target[b] for b in kept}, BT)
        assert simulate(current, moves) == {b: target[b] for b in kept}


def test_compact_moves_the_leading_run_too() -> None:
    # sink 0 and control 1-2, retrieved 5, tail run 9: one run of 5 blocks ending at 10
    starts = window_layout({0, 1, 2, 5, 9}, 10, BT, PositionMode.COMPACT)
    assert starts == {0: 5 * BT, 1: 6 * BT, 2: 7 * BT, 5: 8 * BT, 9: 9 * BT}
    assert window_layout(set(range(12)), 12, BT, PositionMode.COMPACT) == {
        b: b * BT for b in range(12)
    }
