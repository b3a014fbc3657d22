"""Room for decodes outside prefill (kvmem.memory.eviction): exact victims, images whole."""

from __future__ import annotations

from kvmem.memory.eviction import Residency, plan_room, whole_groups
from kvmem.memory.planner import Tier, WindowPlan, block_groups
from kvmem.memory.spans import TokenSpan

BT = 128


def _units(*spans: TokenSpan, n_complete: int = 10):
    return block_groups(spans, BT, n_complete)


def test_without_groups_the_first_n_blocks():
    assert whole_groups([3, 4, 5, 6], 2, (), {}, range(10)) == [3, 4]


def test_a_group_is_taken_whole():
    units = _units(TokenSpan(4 * BT + 10, 6 * BT + 20))  # blocks 4, 5, 6
    assert whole_groups([3, 4, 5, 7], 2, (), units, range(10)) == [3, 7]  # 6 not in order
    assert whole_groups([4, 5, 6, 7], 1, (), units, range(10)) == [4, 5, 6]
    assert whole_groups([5, 6, 4, 7], 2, (), units, range(10)) == [4, 5, 6]


def test_a_group_with_a_taken_member_is_skipped():
    units = _units(TokenSpan(4 * BT, 6 * BT))  # blocks 4, 5
    assert whole_groups([4, 7, 8], 1, (), units, range(10)) == [7]
    assert whole_groups([4, 5, 7], 1, (5,), units, range(10)) == [7]


def test_members_already_on_the_host_are_not_evicted_again():
    units = _units(TokenSpan(4 * BT, 7 * BT))  # blocks 4, 5, 6; 5 on the host
    assert whole_groups([4, 6, 8], 1, (), units, {4, 6, 8}) == [4, 6]


def _plan(selected, retrieved) -> WindowPlan:
    pinned = tuple(b for b in selected if b not in retrieved)
    tiers = {Tier.SINK: pinned, Tier.RETRIEVED: tuple(retrieved)}
    return WindowPlan(tuple(selected), tiers, {}, tuple(selected), (), ())


def test_ring_spill_first_then_retrieved_then_unpinned_then_pinned():
    # 12 blocks of history + 40 tokens; generation started at block 8
    res = Residency(tuple(range(13)), 12 * BT + 40, 12, BT)
    plan = _plan(selected=(0, 1, 2, 3, 4, 5), retrieved=(3, 4))
    room = plan_room(res, 2, 8 * BT, plan)
    assert (room.spilled, room.evicted) == ((8, 9), ())
    room = plan_room(res, 6, 8 * BT, plan)  # spill 8..11 (never 12, before the next token)
    assert (room.spilled, room.evicted) == ((8, 9, 10, 11), (3, 4))
    room = plan_room(res, 3, None, plan)  # replay room: no spill
    assert (room.spilled, room.evicted) == ((), (3, 4, 6))


def test_an_image_in_the_generation_is_spilled_whole():
    res = Residency(tuple(range(13)), 12 * BT + 40, 12, BT)
    image = TokenSpan(8 * BT + 5, 10 * BT + 5)  # blocks 8, 9, 10
    room = plan_room(res, 1, 8 * BT, None, [image])
    assert room.spilled == (8, 9, 10)


def test_plain_reference_without_groups():
    """Against the rule written out: spill[:n], then the preference order."""
    res = Residency((0, 1, 2, 5, 6, 7, 9, 10, 11), 11 * BT + 3, 11, BT)
    plan = _plan(selected=(0, 1, 2, 5, 9), retrieved=(5,))
    for n in range(1, 9):
        for gen_start in (None, 6 * BT, 9 * BT):
            spill = [] if gen_start is None else [b for b in res.gpu_blocks if 6 <= b < 11]
            if gen_start == 9 * BT:
                spill = [9, 10]
            spill = spill[:n]
            rest_pool = [b for b in res.gpu_blocks if b < 10 and b not in spill]
            rank = {5: 0, 0: 2, 1: 2, 2: 2, 9: 2}
            rest = sorted(rest_pool, key=lambda b: (rank.get(b, 1), b))[: n - len(spill)]
            room = plan_room(res, n, gen_start, plan)
            assert (list(room.spilled), list(room.evicted)) == (spill, rest), (n, gen_start)
