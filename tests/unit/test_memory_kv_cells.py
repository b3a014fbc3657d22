"""The model of llama.cpp's cell placement (memory/kv_cells.py), against a plain
transcription of `find_slot` / `apply_ubatch` / `seq_rm` and on hand-worked cases."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvmem.memory.kv_cells import FREE, FreshCells, KVCells


class PlainCells:
    """llama.cpp 0.3.36's rules, cell by cell (the reference)."""

    def __init__(self, n_cells: int) -> None:
        self.pos = [FREE] * n_cells
        self.head = 0

    def remove(self, p0: int, p1: int) -> None:
        new_head = len(self.pos)
        for i, p in enumerate(self.pos):
            if p != FREE and p0 <= p < p1:
                self.pos[i] = FREE
                new_head = min(new_head, i)
        if new_head != len(self.pos) and new_head < self.head:
            self.head = new_head

    def place_ubatch(self, positions: list[int]) -> None:
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
            self.pos[i] = p
        self.head = idxs[-1] + 1


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
