"""memory.draft_mirror: the MTP drafter's backlog of rows not yet mirrored and its set of
mirrored positions, against plain reference implementations (a list of (pos, token, row)
and a Python set)."""

from __future__ import annotations

import numpy as np
import pytest

from kvmem.memory.draft_mirror import DraftBacklog, PositionSet

N_EMBD = 4


def rows_for(start: int, n: int) -> np.ndarray:
    """A row per position whose values name the position."""
    return np.repeat(np.arange(start, start + n, dtype=np.float32)[:, None], N_EMBD, axis=1)


class RefBacklog:
    """The reference: a list of (pos, token, row), the same bound and drop rule."""

    def __init__(self, max_rows: int) -> None:
        self.max_rows = max_rows
        self.items: list[tuple[int, int, list[float]]] = []
        self.dropped = 0

    def add(self, tokens: list[int], start: int, rows: np.ndarray) -> None:
        self.items = [it for it in self.items if it[0] < start]
        new = [(start + i, t, rows[i].tolist()) for i, t in enumerate(tokens)]
        if len(new) > self.max_rows:
            self.dropped += len(new) - self.max_rows
            new = new[len(new) - self.max_rows :]
        if len(self.items) + len(new) > self.max_rows:
            self.dropped += len(self.items)
            self.items = []
        self.items += new

    def runs(self, max_run: int) -> list[tuple[int, list[int], list[list[float]]]]:
        out: list[tuple[int, list[int], list[list[float]]]] = []
        for pos, tok, row in self.items:
            last = out[-1] if out else None
            if last is not None and last[0] + len(last[1]) == pos and len(last[1]) < max_run:
                last[1].append(tok)
                last[2].append(row)
            else:
                out.append((pos, [tok], [row]))
        self.items = []
        return out


def as_plain(runs) -> list[tuple[int, list[int], list[list[float]]]]:
    return [(r.start_pos, r.tokens, r.rows.tolist()) for r in runs]


def test_steps_accumulate_then_come_out_as_one_run_per_batch() -> None:
    b, ref = DraftBacklog(16), RefBacklog(16)
    for pos in range(100, 110):  # ten plain steps, one row each
        for x in (b, ref):
            x.add([pos + 1000], pos, rows_for(pos, 1))
    assert b.n_rows == 10 and b.first_pos == 100
    got = as_plain(b.take(4))
    assert got == ref.runs(4)
    assert [(s, len(t)) for s, t, _ in got] == [(100, 4), (104, 4), (108, 2)]
    assert b.n_rows == 0 and b.take(4) == []


def test_rejected_rows_are_cut_and_a_rewind_replaces_them() -> None:
    b, ref = DraftBacklog(16), RefBacklog(16)
    for x in (b, ref):
        x.add([1, 2, 3, 4], 50, rows_for(50, 4))  # a verification batch of 1 + 3 drafts
    b.cut(52)  # two accepted: cells from 52 removed
    ref.items = [it for it in ref.items if it[0] < 52]
    for x in (b, ref):
        x.add([9, 8], 51, rows_for(51, 2))  # a re-decode from 51 replaces row 51
    got = as_plain(b.take(8))
    assert got == ref.runs(8) == [(50, [1, 9, 8], rows_for(50, 3).tolist())]


def test_overflow_drops_the_held_rows_and_keeps_the_newest() -> None:
    b, ref = DraftBacklog(5), RefBacklog(5)
    for pos in range(0, 12):
        for x in (b, ref):
            x.add([pos], pos, rows_for(pos, 1))
    assert b.dropped_rows == ref.dropped == 10
    assert as_plain(b.take(8)) == ref.runs(8) == [(10, [10, 11], rows_for(10, 2).tolist())]
    b.add(list(range(7)), 20, rows_for(20, 7))  # more rows than the bound at once
    assert b.dropped_rows == 12
    assert as_plain(b.take(8)) == [(22, [2, 3, 4, 5, 6], rows_for(22, 5).tolist())]


def test_remove_and_shift_keep_order_or_drop_everything() -> None:
    b = DraftBacklog(16)
    b.add([1, 2, 3, 4, 5], 10, rows_for(10, 5))
    b.remove(11, 13)
    assert as_plain(b.take(8)) == [
        (10, [1], rows_for(10, 1).tolist()),
        (13, [4, 5], rows_for(13, 2).tolist()),
    ]
    b.add([1, 2, 3], 10, rows_for(10, 3))
    b.shift(10, -1, -4)  # all of them move down: still in order
    assert as_plain(b.take(8)) == [(6, [1, 2, 3], rows_for(10, 3).tolist())]
    b.add([1, 2, 3], 10, rows_for(10, 3))
    b.shift(12, 13, -5)  # the last row would come before the others
    assert b.n_rows == 0 and b.dropped_rows == 3


def test_a_bound_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="max_rows"):
        DraftBacklog(0)


def test_position_set_against_a_python_set() -> None:
    s, ref = PositionSet(), set()
    ops = [
        ("add", 0, 40),
        ("discard", 10, 20),
        ("add", 100, 130),
        ("shift", 100, 130, -60),
        ("discard", 65, -1),
        ("add", 3000, 3010),
        ("shift", 0, 5, -3),
    ]
    for op, *args in ops:
        getattr(s, op)(*args)
        if op == "add":
            ref |= set(range(args[0], args[1]))
        elif op == "discard":
            ref -= {p for p in ref if p >= args[0] and (args[1] < 0 or p < args[1])}
        else:
            p0, p1, delta = args
            moved = {p for p in ref if p >= p0 and (p1 < 0 or p < p1)}
            ref = (ref - moved) | {p + delta for p in moved if p + delta >= 0}
        assert len(s) == len(ref)
        for p0, p1 in ((0, 5), (0, 10), (20, 40), (40, 45), (60, 65), (3000, 3010), (5000, 5001)):
            assert s.covers(p0, p1) == (set(range(p0, p1)) <= ref), (op, p0, p1)
