"""QueryRows (memory/query_rows.py) against a plain per-position reference."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvmem.memory.query_rows import QueryRows, merged
from kvmem.memory.spans import TokenSpan

LAYERS = (3, 7)


def rows_at(start: int, n: int, stamp: int) -> dict[int, np.ndarray]:
    """Rows whose values say their position, layer and the add that made them."""
    out = {}
    for layer in LAYERS:
        pos = np.arange(start, start + n, dtype=np.float32)  # [n]
        out[layer] = np.stack([pos, np.full(n, layer), np.full(n, stamp)], axis=1).astype(
            np.float32
        )[:, None, :]  # [n, 1 head, 3]
    return out


class Reference:
    """position -> (layer -> row); the plain form of what QueryRows keeps."""

    def __init__(self) -> None:
        self.at: dict[int, dict[int, np.ndarray]] = {}

    def add(self, start: int, rows: dict[int, np.ndarray]) -> None:
        for i in range(len(rows[LAYERS[0]])):
            self.at[start + i] = {k: v[i] for k, v in rows.items()}

    def truncate(self, n_keep: int) -> None:
        self.at = {p: r for p, r in self.at.items() if p < n_keep}

    def keep_only(self, spans: list[TokenSpan]) -> None:
        self.at = {p: r for p, r in self.at.items() if any(s.start <= p < s.end for s in spans)}

    def first_missing(self, span: TokenSpan, before: int) -> int | None:
        return next((p for p in range(span.start, min(span.end, before)) if p not in self.at), None)


spans_st = st.builds(lambda a, n: TokenSpan(a, a + n), st.integers(0, 60), st.integers(0, 30))
ops_st = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 60), st.integers(1, 25)),
        st.tuples(st.just("truncate"), st.integers(0, 90)),
        st.tuples(st.just("keep"), st.lists(spans_st, max_size=3)),
    ),
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(ops=ops_st, probe=spans_st, before=st.integers(0, 100))
def test_query_rows_match_a_per_position_reference(ops, probe, before):
    rows, ref = QueryRows(), Reference()
    for i, op in enumerate(ops):
        if op[0] == "add":
            got = rows_at(op[1], op[2], stamp=i)
            rows.add(op[1], got)
            ref.add(op[1], got)
        elif op[0] == "truncate":
            rows.truncate(op[1])
            ref.truncate(op[1])
        else:
            rows.keep_only(op[1])
            ref.keep_only(op[1])
    assert rows.n_positions == len(ref.at)
    starts = [r.start for r in rows.runs]
    assert starts == sorted(starts)
    assert all(a.end <= b.start for a, b in zip(rows.runs, rows.runs[1:], strict=False))
    assert rows.first_missing(probe, before) == ref.first_missing(probe, before)
    got = rows.vectors(probe)
    if probe.length == 0 or ref.first_missing(probe, probe.end) is not None:
        assert got is None
        return
    assert got is not None
    assert got.positions.tolist() == list(range(probe.start, probe.end))
    for layer in LAYERS:
        want = np.stack([ref.at[p][layer] for p in range(probe.start, probe.end)])
        np.testing.assert_array_equal(got.by_layer[layer], want)


def test_newer_rows_replace_kept_ones_and_a_cut_drops_what_follows():
    rows = QueryRows()
    rows.add(10, rows_at(10, 10, stamp=1))  # [10, 20)
    rows.add(15, rows_at(15, 10, stamp=2))  # [15, 25) replaces [15, 20)
    assert [(r.start, r.end) for r in rows.runs] == [(10, 15), (15, 25)]
    assert rows.vectors(TokenSpan(12, 18)).by_layer[3][:, 0, 2].tolist() == [1, 1, 1, 2, 2, 2]
    rows.truncate(17)
    assert [(r.start, r.end) for r in rows.runs] == [(10, 15), (15, 17)]
    assert rows.first_missing(TokenSpan(10, 30), before=30) == 17
    assert rows.first_missing(TokenSpan(10, 30), before=17) is None
    assert rows.first_missing(TokenSpan(5, 30), before=30) == 5


def test_merged_spans_are_disjoint_and_ascending():
    got = merged([TokenSpan(20, 30), TokenSpan(0, 5), TokenSpan(4, 8), TokenSpan(30, 31)])
    assert got == [TokenSpan(0, 8), TokenSpan(20, 31)]
    assert merged([TokenSpan(3, 3)]) == []
