"""The block summaries of the retrieval index, laid out so that scoring needs no gather.

Per scored layer and KV head, every summary kind is a contiguous row-major matrix with one
row per stored block: the mean keys float32 [n_scored, n_kv, capacity, head_dim] and the
key bounds float32 [n_scored, n_kv, capacity, 2 * head_dim], each row [max | min] (the
operand of the bound score q+ . max + q- . min). Scoring multiplies the query by all the
rows in use (`mean_keys`, `bound_keys`: views, no copy) and picks the candidates' columns
from the result. Rows [0, len) are dense: a removed block's row is filled with the last
row, so the order of rows is not the order of block ids; `rows` maps ids to rows. The
capacity doubles when full.

Scoring reads the candidates' rows through `gather` (a copy, under the table's lock), so
a score depends on the candidates alone, never on which other rows the table holds, and
a scoring thread may read while another thread stores new summaries.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence

import numpy as np

from kvmem.errors import MemoryLayoutError

_INITIAL_CAPACITY = 64
N_STATS = 3  # the per-block statistics, along axis 1 of `stats`/`put`:
STAT_MEAN, STAT_MIN, STAT_MAX = 0, 1, 2


class SummaryTable:
    """Block id -> row map over per-(layer, KV head) matrices of block summaries."""

    def __init__(self, n_scored: int, n_kv: int, head_dim: int) -> None:
        self._head_dim = head_dim
        # [n_scored, n_kv, capacity, head_dim]
        self._mean = np.zeros((n_scored, n_kv, _INITIAL_CAPACITY, head_dim), dtype=np.float32)
        # [n_scored, n_kv, capacity, 2 * head_dim]: [max | min] per row
        self._bound = np.zeros((n_scored, n_kv, _INITIAL_CAPACITY, 2 * head_dim), np.float32)
        self._row_of: dict[int, int] = {}
        self._id_of_row: list[int] = []
        self._lock = threading.Lock()  # writers (put, remove) against `gather`

    @property
    def stats_shape(self) -> tuple[int, int, int, int]:
        """The shape of one block's summaries: (N_STATS, n_scored, n_kv, head_dim)."""
        n_scored, n_kv, _, head_dim = self._mean.shape
        return (N_STATS, n_scored, n_kv, head_dim)

    def put(self, block_ids: Sequence[int], stats: np.ndarray) -> None:
        """Store summaries float32 [n_blocks, N_STATS, n_scored, n_kv, head_dim], replacing
        those of ids already held (a repeated id: its last summary wins)."""
        if stats.shape != (len(block_ids), *self.stats_shape):
            raise MemoryLayoutError(f"summaries {list(stats.shape)} do not fit this index")
        last = {int(b): i for i, b in enumerate(block_ids)}  # id -> its last position
        if not last:
            return
        with self._lock:
            self._put(last, stats)

    def _put(self, last: dict[int, int], stats: np.ndarray) -> None:
        self._reserve(len(self._id_of_row) + len(last))
        for block_id in last:
            if block_id not in self._row_of:
                self._row_of[block_id] = len(self._id_of_row)
                self._id_of_row.append(block_id)
        rows = np.fromiter((self._row_of[b] for b in last), dtype=np.int64)  # [n_unique]
        picked = stats[np.fromiter(last.values(), dtype=np.int64)]  # [n_unique, 3, L, kv, hd]
        hd = self._head_dim
        # each [n_scored, n_kv, n_unique, head_dim]
        self._mean[:, :, rows] = picked[:, STAT_MEAN].transpose(1, 2, 0, 3)
        self._bound[:, :, rows, :hd] = picked[:, STAT_MAX].transpose(1, 2, 0, 3)
        self._bound[:, :, rows, hd:] = picked[:, STAT_MIN].transpose(1, 2, 0, 3)

    def remove(self, block_ids: Iterable[int]) -> None:
        """Forget blocks (the last row fills the hole); ids not held are ignored."""
        with self._lock:
            for block_id in block_ids:
                self._remove(block_id)

    def _remove(self, block_id: int) -> None:
        row = self._row_of.pop(block_id, None)
        if row is None:
            return
        last = len(self._id_of_row) - 1
        moved = self._id_of_row.pop()
        if row != last:
            self._mean[:, :, row] = self._mean[:, :, last]
            self._bound[:, :, row] = self._bound[:, :, last]
            self._id_of_row[row] = moved
            self._row_of[moved] = row

    def rows(self, block_ids: Sequence[int]) -> np.ndarray:
        """int64 [n_blocks]: the rows of the blocks in `mean_keys`/`bound_keys`."""
        try:
            return np.fromiter((self._row_of[b] for b in block_ids), dtype=np.int64)
        except KeyError as exc:
            raise MemoryLayoutError(f"block {exc.args[0]} is not in the retrieval index") from None

    def stats(self, block_ids: Sequence[int]) -> np.ndarray:
        """float32 [n_blocks, N_STATS, n_scored, n_kv, head_dim], a new array."""
        rows, hd = self.rows(block_ids), self._head_dim  # [n_blocks]
        out = np.empty((len(rows), *self.stats_shape), dtype=np.float32)
        out[:, STAT_MEAN] = self._mean[:, :, rows].transpose(2, 0, 1, 3)
        bound = self._bound[:, :, rows].transpose(2, 0, 1, 3)  # [n_blocks, L, kv, 2 * hd]
        out[:, STAT_MAX], out[:, STAT_MIN] = bound[..., :hd], bound[..., hd:]
        return out

    def gather(self, layer: int, rows: np.ndarray, bound: bool) -> np.ndarray:
        """float32 [n_kv, n_rows, d]: one scored layer's rows `rows` (int64 [n_rows], from
        `rows`), a copy: the [max | min] rows (d = 2 head_dim) or the mean keys."""
        with self._lock:
            return (self._bound if bound else self._mean)[layer][:, rows]

    @property
    def mean_keys(self) -> np.ndarray:
        """float32 [n_scored, n_kv, len, head_dim]: a view of the mean keys in use."""
        return self._mean[:, :, : len(self._id_of_row)]

    @property
    def bound_keys(self) -> np.ndarray:
        """float32 [n_scored, n_kv, len, 2 * head_dim]: a view of the [max | min] rows."""
        return self._bound[:, :, : len(self._id_of_row)]

    def __contains__(self, block_id: object) -> bool:
        return block_id in self._row_of

    def __len__(self) -> int:
        return len(self._id_of_row)

    def block_ids(self) -> tuple[int, ...]:
        return tuple(sorted(self._row_of))

    @property
    def nbytes(self) -> int:
        """Bytes allocated (capacity, not only the rows in use)."""
        return int(self._mean.nbytes + self._bound.nbytes)

    def _reserve(self, n_rows: int) -> None:
        capacity = self._mean.shape[2]
        if n_rows <= capacity:
            return
        while capacity < n_rows:
            capacity *= 2
        used = len(self._id_of_row)
        for name in ("_mean", "_bound"):
            old = getattr(self, name)  # [n_scored, n_kv, capacity, d]
            grown = np.zeros((*old.shape[:2], capacity, old.shape[3]), dtype=np.float32)
            grown[:, :, :used] = old[:, :, :used]
            setattr(self, name, grown)
