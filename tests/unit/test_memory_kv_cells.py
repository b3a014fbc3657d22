"""The model of llama.cpp's cell placement (memory/kv_cells.py), against a plain
transcription of `find_slot` / `apply_ubatch` / `seq_rm` and on hand-worked cases."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvmem.memory.kv_cells import FREE, FreshCells, KVCells, LayPlan, plan_lay


class PlainCells:
    """llama.cpp 0.3.36's rules, cell by cell (the reference): `find_slot`,
    `apply_ubatch`, `seq_rm`, `seq_add`, `seq_cp`, `clear` on one stream."""

    def __init__(self, n_cells: int) -> None:
        self.pos = [FREE] * n_cells
        self.seq: list[set[int]] = [set() for _ in range(n_cells)]
        self.head = 0

    @staticmethod
    def _inside(p: int, p0: int, p1: int) -> bool:
        return p != FREE and max(p0, 0) <= p < (p1 if p1 >= 0 else 1 << 62)

    def remove(self, p0: int, p1: int, seq: int = 0) -> None:
        new_head = len(self.pos)
        for i, p in enumerate(self.pos):
            if not self._inside(p, p0, p1) or (seq >= 0 and seq not in self.seq[i]):
                continue
            self.seq[i] = self.seq[i] - {seq} if seq >= 0 else set()
            if not self.seq[i]:
                self.pos[i] = FREE
                new_head = min(new_head, i)
        if new_head != len(self.pos) and new_head < self.head:
            self.head = new_head

    def shift(self, seq: int, p0: int, p1: int, delta: int) -> None:
        if delta == 0 or max(p0, 0) == (p1 if p1 >= 0 else 1 << 62):
            return
        new_head = len(self.pos)
        for i, p in enumerate(self.pos):
            if self._inside(p, p0, p1) and seq in self.seq[i]:
                self.pos[i] = p + delta
                if self.pos[i] < 0:
                    self.pos[i], self.seq[i] = FREE, set()
                    new_head = min(new_head, i)
        self.head = new_head if new_head != len(self.pos) else 0

    def copy_seq(self, src: int, dst: int, p0: int, p1: int) -> None:
        for i, p in enumerate(self.pos):
            if src != dst and self._inside(p, p0, p1) and src in self.seq[i]:
                self.seq[i].add(dst)

    def place_ubatch(self, positions: list[int], seq: int = 0) -> None:
        n, size = len(positions), len(self.pos)
        used = sum(p != FREE for p in self.pos)
        head_cur = 0 if self.head > used + 2 * n else self.head
        idxs: list[int] = []
        tested = 0
        while len(idxs) < n:
            if head_cur + 1 > size:
                tested += size - head_cur
                head_cur = 0
                continue
            if self.pos[head_cur] == FREE:
                idxs.append(head_cur)
            head_cur += 1
            tested += 1
            assert tested <= size
        for i, p in zip(idxs, positions, strict=True):
            self.pos[i], self.seq[i] = p, {seq}
        self.head = idxs[-1] + 1

    def masks(self) -> list[int]:
        return [sum(1 << s for s in seqs) for seqs in self.seq]


def test_freed_cells_below_the_head_are_filled_first_then_the_end() -> None:
    cells = KVCells.empty(16)
    cells.place(np.arange(0, 8, dtype=np.int64), 4)  # cells 0-7, head 8
    cells.remove(2, 4)  # cells 2-3 free, head back to 2
    assert cells.head == 2
    cells.place(np.arange(8, 12, dtype=np.int64), 4)  # 2, 3, then 8, 9
    assert cells.pos.tolist() == [0, 1, 8, 9, 4, 5, 6, 7, 10, 11] + [FREE] * 6
    assert cells.layout().tolist() == [0, 1, 8, 9, 4, 5, 6, 7, 10, 11]
    assert cells.head == 10 and cells.packed()


def test_a_head_far_past_the_cells_in_use_searches_from_cell_0() -> None:
    cells = KVCells.empty(32)
    cells.place(np.arange(0, 20, dtype=np.int64), 32)
    cells.remove(0, 18)  # head 0 (the first freed)
    cells.place(np.arange(20, 22, dtype=np.int64), 32)  # cells 0, 1; head 2
    cells.remove(18, 20)  # cells 18, 19: not below the head, which stays
    assert cells.head == 2
    cells.head = 12  # as a search that ended there would leave it: 12 > 2 + 2 * 2
    cells.place(np.arange(22, 24, dtype=np.int64), 32)
    assert np.flatnonzero(cells.pos != FREE).tolist() == [0, 1, 2, 3]
    assert not KVCells(np.array([FREE, 5], dtype=np.int64)).packed()


ops = st.lists(
    st.one_of(
        st.tuples(st.just("place"), st.integers(1, 12), st.sampled_from([1, 4, 8])),
        st.tuples(st.just("remove"), st.integers(0, 40), st.integers(1, 12)),
    ),
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(ops)
def test_the_model_places_every_cell_as_the_plain_rules_do(steps) -> None:
    cells, plain, next_pos = KVCells.empty(24), PlainCells(24), 0
    for kind, a, b in steps:
        if kind == "remove":
            cells.remove(a, a + b)
            plain.remove(a, a + b)
            continue
        n = min(a, 24 - cells.n_used)
        if n == 0:
            continue
        positions = list(range(next_pos, next_pos + n))
        next_pos += n
        cells.place(np.array(positions, dtype=np.int64), b)
        for u0 in range(0, n, b):
            plain.place_ubatch(positions[u0 : u0 + b])
        assert cells.pos.tolist() == plain.pos and cells.head == plain.head


def test_fresh_chunks_evict_outside_their_window_then_decode() -> None:
    """Chunks of 2 blocks (4 tokens each): the third chunk keeps blocks 0 and 3 only, so
    its tokens take the cells blocks 1 and 2 held."""
    fresh = FreshCells(KVCells.empty(24), block_tokens=4, ubatch=8)
    fresh.chunk(0, 8, keep=set())
    fresh.chunk(8, 16, keep={0, 1})
    fresh.chunk(16, 24, keep={0, 3})
    assert fresh.on_gpu == {0, 3, 4, 5}
    layout = fresh.cells.layout().tolist()
    assert layout == [0, 1, 2, 3, 16, 17, 18, 19, 20, 21, 22, 23, 12, 13, 14, 15]


def test_block_order_is_whole_blocks_from_cell_0_or_none() -> None:
    fresh = FreshCells(KVCells.empty(24), block_tokens=4, ubatch=8)
    fresh.chunk(0, 8, keep=set())
    fresh.chunk(8, 16, keep={0, 1})
    fresh.chunk(16, 24, keep={0, 3})
    assert fresh.cells.block_order(4) == [0, 4, 5, 3]
    cells = KVCells.empty(8)
    cells.place(np.arange(0, 6, dtype=np.int64), 8)
    assert cells.block_order(4) is None  # a block not whole
    cells.remove(0, 2)
    assert cells.block_order(2) is None  # not packed from cell 0
    shuffled = KVCells(np.array([1, 0, 2, 3], dtype=np.int64))
    assert shuffled.block_order(2) is None  # a block out of position order


live_ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("place"), st.integers(1, 10), st.sampled_from([1, 4, 16]), st.integers(0, 2)
        ),
        st.tuples(st.just("remove"), st.integers(-1, 40), st.integers(-1, 12), st.integers(-1, 2)),
        st.tuples(st.just("shift"), st.integers(-1, 40), st.integers(1, 12), st.integers(-30, 30)),
        st.tuples(st.just("copy"), st.integers(-1, 40), st.integers(-1, 12), st.integers(0, 2)),
        st.tuples(st.just("clear"), st.just(0), st.just(0), st.just(0)),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(live_ops)
def test_the_live_cells_follow_every_call_as_the_plain_rules_do(steps) -> None:
    """Decodes and restores in any sequence, seq_rm (one sequence or all, open bounds),
    seq_add (cells pushed below 0 freed), seq_cp and clear, as a context makes them."""
    cells, plain, next_pos = KVCells.empty(24), PlainCells(24), 0
    for kind, a, b, c in steps:
        if kind == "place":
            n = min(a, 24 - cells.n_used)
            if n == 0:
                continue
            positions = list(range(next_pos, next_pos + n))
            next_pos += n
            cells.place(np.array(positions, dtype=np.int64), b, seq=c)
            for u0 in range(0, n, b):
                plain.place_ubatch(positions[u0 : u0 + b], c)
        elif kind == "remove":
            p1 = -1 if b < 0 else a + b
            cells.remove(a, p1, c)
            plain.remove(a, p1, c)
        elif kind == "shift":
            cells.shift(c % 3, a, a + b, c)
            plain.shift(c % 3, a, a + b, c)
        elif kind == "copy":
            p1 = -1 if b < 0 else a + b
            cells.copy_seq(c, (c + 1) % 3, a, p1)
            plain.copy_seq(c, (c + 1) % 3, a, p1)
        else:
            cells.clear()
            plain = PlainCells(24)
        assert cells.pos.tolist() == plain.pos and cells.head == plain.head
        assert cells.seqs.tolist() == plain.masks()
        assert cells.n_used == sum(p != FREE for p in plain.pos)
        assert not cells.seqs[cells.top :].any()  # the searches' bound holds every cell in use


def _laid(order: list[int], bt: int, n_cells: int) -> KVCells:
    cells = KVCells.empty(n_cells)
    for b in order:
        cells.place(np.arange(b * bt, (b + 1) * bt, dtype=np.int64), bt)
    return cells


def test_a_lay_keeps_the_blocks_already_in_their_fresh_cells() -> None:
    """Live cells hold blocks 0, 1, 5, 6 (cells 0-7); the fresh order is 0, 1, 2, 3: blocks
    0 and 1 stay, 5 and 6 leave, 2 and 3 go in after them."""
    live = _laid([0, 1, 5, 6], 2, 16)
    plan = plan_lay(live, [0, 1, 2, 3], {0, 1, 5, 6}, {}, 2)
    assert plan == LayPlan(2, (5, 6), (2, 3), False)
    same = plan_lay(live, [0, 1, 5, 6], {0, 1, 5, 6}, {}, 2)
    assert same == LayPlan(4, (), (), False)  # nothing to lay


def test_a_moved_block_or_a_block_out_of_its_fresh_cell_is_laid_again() -> None:
    live = _laid([0, 1, 5, 6], 2, 16)
    live.shift(0, 2, 4, 6)  # block 1's cells hold positions 8, 9 now
    moved = plan_lay(live, [0, 1, 5, 6], {0, 1, 5, 6}, {1: 8}, 2)
    assert moved == LayPlan(3, (1,), (1,), False)  # 1 leaves and comes back to cells 2, 3
    live = _laid([0, 1, 5, 6], 2, 16)
    swapped = plan_lay(live, [0, 5, 1, 6], {0, 1, 5, 6}, {}, 2)
    assert swapped == LayPlan(2, (1, 5), (5, 1), False)  # 0 and 6 stay


def test_a_lay_empties_the_context_when_evictions_cannot_free_the_cells_after() -> None:
    live = _laid([0, 1, 5], 2, 16)
    live.place(np.array([12], dtype=np.int64), 1)  # the open tail: not a block on the GPU
    assert plan_lay(live, [0, 1], {0, 1, 5}, {}, 2) == LayPlan(0, (), (0, 1), True)
    assert plan_lay(None, [0, 1], {0, 1}, {}, 2) == LayPlan(0, (), (0, 1), True)
    far = _laid([0, 1, 5], 2, 16)
    assert plan_lay(far, [0, 1, 2], {0, 1, 5}, {}, 2) == LayPlan(2, (5,), (2,), False)
    far = _laid([0, 1], 2, 16)
    far.head = 6  # a search would start past the free cells 4, 5
    assert plan_lay(far, [0, 1, 2], {0, 1}, {}, 2) == LayPlan(0, (), (0, 1, 2), True)


@st.composite
def _lays(draw: st.DrawFn) -> tuple[KVCells, list[int], int]:
    """Live cells made by block decodes and evictions, a fresh order of some blocks, and
    the size of the pieces a restore goes in."""
    live, on = KVCells.empty(32), []
    for b in draw(st.lists(st.integers(0, 9), max_size=14)):
        if b in on:
            live.remove(2 * b, 2 * b + 2)
            on.remove(b)
        elif live.n_used + 2 <= 32:
            live.place(np.arange(2 * b, 2 * b + 2, dtype=np.int64), 2)
            on.append(b)
    order = draw(st.permutations(range(10)).map(lambda p: p[: draw(st.integers(0, 10))]))
    return live, list(order), draw(st.sampled_from([2, 4, 20]))


@settings(max_examples=300, deadline=None)
@given(_lays())
def test_a_lay_applied_leaves_exactly_the_fresh_cells(case) -> None:
    """Whatever the live cells, the plan's evictions and then its restore (one blob, in
    pieces) leave the fresh order's blocks packed from cell 0 in that order."""
    live, order, piece = case
    on_gpu = {int(p) // 2 for p in live.layout()}
    plan = plan_lay(live, order, on_gpu, {}, 2)
    if plan.clear:
        live.clear()
    for b in plan.evict:
        live.remove(2 * b, 2 * b + 2)
    cells = np.concatenate([np.arange(2 * b, 2 * b + 2) for b in plan.restore] or [[]])
    for p0 in range(0, len(cells), piece):
        live.place(cells[p0 : p0 + piece].astype(np.int64), piece)
    assert live.block_order(2) == order or (order == [] and live.n_used == 0)
    assert plan.kept + len(plan.restore) == len(order)
