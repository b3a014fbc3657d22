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

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from .block_table import block_runs

FREE = -1


@dataclass(slots=True)
class KVCells:
    """The positions the cells hold (FREE: none), the sequences holding each, the search
    head. A live copy follows every change a context makes (LlamaContext.cells)."""

    pos: np.ndarray  # int64 [n_cells]: the position cell i holds, or FREE
    head: int = 0
    seqs: np.ndarray | None = None  # uint8 [n_cells]: bit s set while sequence s holds it
    n_used: int = 0  # cells some sequence holds
    top: int = 0  # every cell from here on is free (the searches read the cells below)

    def __post_init__(self) -> None:
        if self.seqs is None:  # positions alone: sequence 0 holds the cells in use
            self.seqs = (self.pos != FREE).astype(np.uint8)  # uint8 [n_cells]
        used = np.flatnonzero(self.seqs)  # int64 [n_used]
        self.n_used = len(used)
        self.top = int(used[-1]) + 1 if len(used) else 0

    @classmethod
    def empty(cls, n_cells: int) -> KVCells:
        return cls(np.full(n_cells, FREE, dtype=np.int64))

    def copy(self) -> KVCells:
        return KVCells(self.pos.copy(), self.head, self.seqs.copy())  # n_used, top: counted

    def clear(self) -> None:
        """Every cell free, the head at 0 (llama_memory_clear)."""
        self.pos[:] = FREE
        self.seqs[:] = 0
        self.n_used = self.head = self.top = 0

    def _holding(self, seq: int, p0: int, p1: int) -> np.ndarray:
        """int64 [hit], ascending: the cells of `seq` (-1: any) at positions [p0, p1) (a
        bound below 0: none on that side), as llama.cpp reads them."""
        hi = p1 if p1 >= 0 else np.iinfo(np.int64).max
        pos = self.pos[: self.top]  # int64 [top]
        inside = (pos >= max(p0, 0)) & (pos < hi)  # bool [top]
        if seq >= 0:
            inside &= ((self.seqs[: self.top] >> seq) & 1).astype(bool)
        return np.flatnonzero(inside)

    def _free(self, cells: np.ndarray) -> None:
        self.pos[cells] = FREE
        self.seqs[cells] = 0
        self.n_used -= len(cells)

    def remove(self, p0: int, p1: int, seq: int = 0) -> None:
        """`seq` (-1: every sequence) leaves the cells at positions [p0, p1); those no
        sequence holds any more are freed, and the head goes back to the first of them
        when that is lower (llama_memory_seq_rm)."""
        hit = self._holding(seq, p0, p1)  # int64 [hit]
        if not hit.size:
            return
        if seq >= 0:
            self.seqs[hit] &= np.uint8(~(1 << seq) & 0xFF)
            hit = hit[self.seqs[hit] == 0]
        self._free(hit)
        if hit.size:
            self.head = min(self.head, int(hit[0]))

    def remove_blocks(
        self, blocks: Sequence[int], starts: Mapping[int, int], block_tokens: int
    ) -> None:
        """Sequence 0 leaves the cells of `blocks`, each at `starts[b]` (its first
        position; its own when absent), as their evictions do."""
        for b in blocks:
            p = starts.get(b, b * block_tokens)
            self.remove(p, p + block_tokens)

    def shift(self, seq: int, p0: int, p1: int, delta: int) -> None:
        """Positions [p0, p1) of `seq` move by `delta`; a cell moved below 0 is freed; the
        head goes to the first freed cell, else to 0 (llama_memory_seq_add)."""
        if delta == 0 or max(p0, 0) == (p1 if p1 >= 0 else np.iinfo(np.int64).max):
            return
        hit = self._holding(seq, p0, p1)  # int64 [hit]
        self.pos[hit] += delta
        gone = hit[self.pos[hit] < 0]  # int64 [gone]
        self._free(gone)
        self.head = int(gone[0]) if gone.size else 0

    def copy_seq(self, src: int, dst: int, p0: int, p1: int) -> None:
        """`dst` joins `src` in its cells at positions [p0, p1) (llama_memory_seq_cp, one
        stream: the cells stay)."""
        if src != dst:
            self.seqs[self._holding(src, p0, p1)] |= np.uint8(1 << dst)

    def place(self, positions: np.ndarray, ubatch: int, seq: int = 0) -> None:
        """Cells for `positions` (int64 [n]) of `seq`, decoded or restored in ubatches of
        `ubatch` (a restored blob is one ubatch)."""
        for u0 in range(0, len(positions), ubatch):
            self._place_ubatch(positions[u0 : u0 + ubatch], seq)

    def _place_ubatch(self, positions: np.ndarray, seq: int) -> None:
        n, size = len(positions), len(self.pos)
        start = 0 if self.head > self.n_used + 2 * n else self.head
        if start + n <= size and not self.seqs[start : start + n].any():
            taken = np.arange(start, start + n, dtype=np.int64)  # int64 [n]: the usual case
        else:
            free = np.flatnonzero(self.seqs == 0)  # int64 [n_free], ascending
            if len(free) < n:
                raise ValueError(f"{n} positions do not fit {len(free)} free cells")
            order = np.concatenate([free[free >= start], free[free < start]])  # from the head
            taken = order[:n]  # int64 [n]
        self.pos[taken] = positions
        self.seqs[taken] = np.uint8(1 << seq)
        self.n_used += n
        self.top = max(self.top, int(taken.max()) + 1)
        self.head = int(taken[-1]) + 1  # at the end: the next search wraps to cell 0

    def layout(self, seq: int = 0) -> np.ndarray:
        """The positions `seq` holds, in cell order (int64 [cells of seq])."""
        return self.pos[((self.seqs >> seq) & 1).astype(bool)]

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

    def copy(self) -> FreshCells:
        return FreshCells(self.cells.copy(), self.block_tokens, self.ubatch, set(self.on_gpu))

    def chunk(self, start: int, end: int, keep: set[int]) -> None:
        """A chunk [start, end): the blocks outside `keep` leave, its tokens come in."""
        bt = self.block_tokens
        for run in block_runs(list(self.on_gpu - keep)):  # one seq_rm a run: the same
            self.cells.remove(run.start * bt, run.stop * bt)  # cells and head as a block each
        self.on_gpu &= keep
        self.cells.place(np.arange(start, end, dtype=np.int64), self.ubatch)
        self.on_gpu.update(range(start // bt, end // bt))


@dataclass(frozen=True, slots=True)
class LayPlan:
    """How a warm session reaches a fresh prefill's cells (a block order packed from cell
    0, `KVCells.block_order`): `kept` blocks of the order stay, being where the session
    holds them already; `evict` leave; `restore`, the order's other blocks in cell order,
    go in as one restore, which takes the cells they left free, in index order. With
    `clear`, the evictions cannot leave exactly the kept blocks' cells in use with the
    search head at or before the first free one (or the live cells are not known): the
    context is emptied and the whole order restored."""

    kept: int
    evict: tuple[int, ...]  # ascending
    restore: tuple[int, ...]  # in cell order
    clear: bool


def plan_lay(
    live: KVCells | None,
    order: Sequence[int],
    on_gpu: Collection[int],
    starts: Mapping[int, int],
    block_tokens: int,
) -> LayPlan:
    """Pure. `live`: the context's cells (sequence 0 alone holding them), None if unknown;
    `order`: the fresh cells' blocks; `on_gpu`: the blocks in the context, each at
    `starts[b]` (its first position; its own, b * block_tokens, when absent)."""
    bt, gpu = block_tokens, set(on_gpu)
    whole = LayPlan(0, (), tuple(order), True)
    if live is None or len(order) * bt > len(live.pos):
        return whole
    in_place = [_in_place(live, i, b, gpu, starts, bt) for i, b in enumerate(order)]
    kept = {b for b, ok in zip(order, in_place, strict=True) if ok}
    evict = tuple(sorted(gpu - kept))
    after = live.copy()
    after.remove_blocks(evict, starts, bt)
    wanted = np.zeros(len(live.pos), dtype=bool)  # bool [n_cells]: the kept blocks' cells
    for i, ok in enumerate(in_place):
        wanted[i * bt : (i + 1) * bt] = ok
    holding = after.seqs != 0  # bool [n_cells]
    first_free = int(np.argmin(holding)) if not holding.all() else len(holding)
    if not np.array_equal(holding, wanted) or after.head > first_free:
        return whole
    restore = tuple(b for b, ok in zip(order, in_place, strict=True) if not ok)
    return LayPlan(len(kept), evict, restore, False)


def _in_place(
    live: KVCells, i: int, b: int, gpu: set[int], starts: Mapping[int, int], bt: int
) -> bool:
    """Whether block `b`, the order's `i`-th, is in the context at its own positions in
    exactly its fresh cells, held by sequence 0 alone."""
    if b not in gpu or starts.get(b, b * bt) != b * bt:
        return False
    cells = slice(i * bt, (i + 1) * bt)
    own = np.arange(b * bt, (b + 1) * bt, dtype=np.int64)  # [bt]
    return bool(np.array_equal(live.pos[cells], own) and np.all(live.seqs[cells] == 1))
