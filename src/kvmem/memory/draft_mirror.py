"""What an MTP draft context holds of the target's rows (engine/spec/mtp_draft.py), numpy only.

- `DraftBacklog`: rows the target decoded that the draft context has not yet seen: token
  x_p at position p with the trunk's hidden state h_{p-1}. Steps taken while the draft
  gate is closed only add here (a row copy, no decode); the next draft (or a block
  harvest) decodes them in one batch. Bounded: when a step would overflow it, the rows
  held are dropped and the draft context starts from a gap (drafts are verified, so the
  output never depends on the draft context's contents).
- `PositionSet`: the positions whose draft-context cells hold mirrored rows (not draft
  rows, not gaps), so a block is copied to the host only when all of its cells are real.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(slots=True)
class BacklogRun:
    """Rows at consecutive positions start_pos .., in decode order."""

    start_pos: int
    tokens: list[int]
    rows: np.ndarray  # float32 [len(tokens), n_embd]: h_{p-1} of each token x_p

    @property
    def end_pos(self) -> int:
        return self.start_pos + len(self.tokens)


class DraftBacklog:
    """At most `max_rows` rows, oldest first, each with its own position."""

    def __init__(self, max_rows: int) -> None:
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        self.max_rows = max_rows
        self.n_rows = 0
        self.dropped_rows = 0  # rows never mirrored because the backlog was full
        self._pos = np.zeros(max_rows, dtype=np.int64)  # [max_rows]
        self._tok = np.zeros(max_rows, dtype=np.int32)  # [max_rows]
        self._rows: np.ndarray | None = None  # float32 [max_rows, n_embd], on the first add

    def add(self, tokens: Sequence[int], start_pos: int, rows: np.ndarray) -> None:
        """Rows of tokens at start_pos ..; held rows at or after start_pos go first."""
        n = len(tokens)
        if self.n_rows and self._pos[self.n_rows - 1] >= start_pos:
            self.cut(start_pos)
        if self._rows is None:
            self._rows = np.zeros((self.max_rows, rows.shape[1]), dtype=np.float32)
        if n > self.max_rows:  # keep the newest rows
            skip = n - self.max_rows
            tokens, rows, start_pos, n = tokens[skip:], rows[skip:], start_pos + skip, n - skip
            self.dropped_rows += skip
        if self.n_rows + n > self.max_rows:
            self.dropped_rows += self.n_rows
            self.n_rows = 0
        at = self.n_rows
        for i, token in enumerate(tokens):  # a step's few rows: no temporaries
            self._pos[at + i] = start_pos + i
            self._tok[at + i] = token
        self._rows[at : at + n] = rows
        self.n_rows += n

    @property
    def first_pos(self) -> int | None:
        return int(self._pos[0]) if self.n_rows else None

    def cut(self, pos: int) -> None:
        """Forget the rows at positions >= pos (positions ascend)."""
        self.n_rows = int(np.searchsorted(self._pos[: self.n_rows], pos, side="left"))

    def remove(self, p0: int, p1: int) -> None:
        """Forget the rows at positions in [p0, p1)."""
        pos = self._pos[: self.n_rows]  # [n_rows]
        self._keep(~((pos >= p0) & (pos < p1)))

    def shift(self, p0: int, p1: int, delta: int) -> None:
        """Positions in [p0, p1) (p1 < 0: to the end) move by delta; all rows are dropped
        when that would leave them out of order."""
        pos = self._pos[: self.n_rows]  # [n_rows]
        moved = (pos >= p0) & ((pos < p1) | (p1 < 0))  # [n_rows]
        pos[moved] += delta
        if self.n_rows > 1 and bool(np.any(np.diff(pos) <= 0)):
            self.dropped_rows += self.n_rows
            self.n_rows = 0

    def _keep(self, mask: np.ndarray) -> None:
        """Keep the rows where mask (bool [n_rows]) is true, in order."""
        idx = np.flatnonzero(mask)  # [n_kept]
        n = len(idx)
        self._pos[:n] = self._pos[idx]
        self._tok[:n] = self._tok[idx]
        if self._rows is not None:
            self._rows[:n] = self._rows[idx]
        self.n_rows = n

    def take(self, max_run: int) -> list[BacklogRun]:
        """All rows as runs of consecutive positions of at most max_run rows each (copies);
        the backlog is empty afterwards."""
        runs: list[BacklogRun] = []
        pos = self._pos[: self.n_rows]  # [n_rows]
        breaks = np.flatnonzero(np.diff(pos) != 1) + 1  # [n_breaks] first row of each run
        for a, b in zip([0, *breaks.tolist()], [*breaks.tolist(), self.n_rows], strict=True):
            for s in range(a, b, max_run):
                e = min(b, s + max_run)
                assert self._rows is not None
                runs.append(
                    BacklogRun(int(pos[s]), self._tok[s:e].tolist(), self._rows[s:e].copy())
                )
        self.n_rows = 0
        return runs


class PositionSet:
    """A set of non-negative positions (a bool array that grows)."""

    def __init__(self) -> None:
        self._has = np.zeros(0, dtype=bool)  # [capacity]

    def _grow(self, end: int) -> None:
        if end > len(self._has):
            grown = np.zeros(max(end, 2 * len(self._has)), dtype=bool)  # [capacity]
            grown[: len(self._has)] = self._has
            self._has = grown

    def add(self, p0: int, p1: int) -> None:
        self._grow(p1)
        self._has[max(p0, 0) : p1] = True

    def discard(self, p0: int, p1: int) -> None:
        """Forget [p0, p1); p1 < 0: to the end."""
        self._has[max(p0, 0) : (len(self._has) if p1 < 0 else p1)] = False

    def covers(self, p0: int, p1: int) -> bool:
        return p1 <= len(self._has) and bool(self._has[p0:p1].all())

    def shift(self, p0: int, p1: int, delta: int) -> None:
        """Positions in [p0, p1) (p1 < 0: to the end) move by delta (below 0: dropped)."""
        p0 = max(p0, 0)
        end = len(self._has) if p1 < 0 else min(p1, len(self._has))
        moved = np.flatnonzero(self._has[p0:end]) + p0 + delta  # [n_moved] new positions
        self._has[p0:end] = False
        moved = moved[moved >= 0]
        if len(moved):
            self._grow(int(moved[-1]) + 1)
            self._has[moved] = True

    def __len__(self) -> int:
        return int(self._has.sum())
