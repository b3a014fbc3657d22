"""A model of where llama.cpp puts a sequence's KV cells (its unified cache, one stream):
the cells a fresh prefill of a prompt fills, so that a warm session can lay its window
in exactly those cells before it goes on (`--kvmem-cell-order canonical`).

The rules are llama.cpp 0.3.36's (`llama_kv_cache::find_slot`, `apply_ubatch`, `seq_rm`):
a decoded ubatch and a restored state blob alike take the first free cells from the
cache's head, one by one, wrapping at the end, after the head goes back to cell 0 when it
is more than twice the ubatch past the cells in use; the head then moves right after the
last cell taken; freeing cells moves the head back to the first one freed when that is
lower; clearing the cache puts it at 0. tests/engine/test_cell_model.py checks the model
against the cells llama.cpp reports (the positions of a state blob, in cell order).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

FREE = -1


@dataclass(slots=True)
class KVCells:
    """The positions the cells hold (FREE: none) and the search head."""

    pos: np.ndarray  # int64 [n_cells]: the position cell i holds, or FREE
    head: int = 0

    @classmethod
    def empty(cls, n_cells: int) -> KVCells:
        return cls(np.full(n_cells, FREE, dtype=np.int64))

    @property
    def n_used(self) -> int:
        return int(np.count_nonzero(self.pos != FREE))

    def remove(self, p0: int, p1: int) -> None:
        """Free the cells holding positions [p0, p1) (llama_memory_seq_rm)."""
        hit = np.flatnonzero((self.pos >= p0) & (self.pos < p1))  # int64 [freed]
        if hit.size:
            self.pos[hit] = FREE
            self.head = min(self.head, int(hit[0]))

    def place(self, positions: np.ndarray, ubatch: int) -> None:
        """Cells for `positions` (int64 [n]), decoded or restored in ubatches of `ubatch`."""
        for u0 in range(0, len(positions), ubatch):
            self._place_ubatch(positions[u0 : u0 + ubatch])

    def _place_ubatch(self, positions: np.ndarray) -> None:
        n = len(positions)
        start = 0 if self.head > self.n_used + 2 * n else self.head
        free = np.flatnonzero(self.pos == FREE)  # int64 [n_free], ascending
        if len(free) < n:
            raise ValueError(f"{n} positions do not fit {len(free)} free cells")
        order = np.concatenate([free[free >= start], free[free < start]])  # from the head on
        taken = order[:n]  # int64 [n]
        self.pos[taken] = positions
        self.head = int(taken[-1]) + 1  # at the end: the next search wraps to cell 0

    def layout(self) -> np.ndarray:
        """The positions held, in cell order (int64 [n_used])."""
        return self.pos[self.pos != FREE]

    def packed(self) -> bool:
        """Whether the cells in use are cells 0 .. n_used - 1."""
        return bool(np.all(self.pos[: self.n_used] != FREE))

    def block_order(self, block_tokens: int) -> list[int] | None:
        """The block ids in cell order when the cells in use are packed from cell 0 and
        hold whole blocks, each in position order (else None: no restore lays them)."""
        order = self.layout()  # int64 [n_used]
        if not self.packed() or len(order) % block_tokens:
            return None
        rows = order.reshape(-1, block_tokens)  # [blocks, block_tokens]
        starts = rows[:, 0]  # int64 [blocks]
        offsets = np.arange(block_tokens, dtype=np.int64)  # [block_tokens]
        if np.any(starts % block_tokens) or np.any(rows != starts[:, None] + offsets):
            return None
        return [int(p) // block_tokens for p in starts]


@dataclass(slots=True)
class FreshCells:
    """The cells of a fresh prefill, chunk by chunk: the blocks each chunk keeps from the
    window before it (`keep(start)`) and then its own tokens."""

    cells: KVCells
    block_tokens: int
    ubatch: int
    on_gpu: set[int] = field(default_factory=set)  # complete blocks in the cells

    def chunk(self, start: int, end: int, keep: set[int]) -> None:
        """A chunk [start, end): the blocks outside `keep` leave, its tokens come in."""
        bt = self.block_tokens
        for b in sorted(self.on_gpu - keep):
            self.cells.remove(b * bt, (b + 1) * bt)
        self.on_gpu &= keep
        self.cells.place(np.arange(start, end, dtype=np.int64), self.ubatch)
        self.on_gpu.update(range(start // bt, end // bt))
