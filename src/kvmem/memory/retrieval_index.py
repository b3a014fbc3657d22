"""Per-block summaries of the keys in the content frame, which retrieval scores against.

For every block and every scored attention layer the index keeps, over the block's
tokens, the mean and the per-channel min and max of its keys with RoPE removed (and, for
a rotated quantized K cache, the Hadamard rotation undone first): float32
[3, n_layers_scored, n_head_kv, head_dim]. The min/max give an upper bound of q.k over the
block's keys (as in Quest), which finds a few relevant tokens that a mean dilutes.
The summaries are stored in a `SummaryTable`: per layer and KV head one matrix per summary
kind, so that scoring is a few large products over the whole table, with no gather.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from kvmem.errors import MemoryLayoutError
from kvmem.memory.ggml_types import GgmlType, dequantize_rows
from kvmem.memory.rope import RopeParams, remove_rope, undo_hadamard
from kvmem.memory.summary_table import STAT_MAX, STAT_MEAN, STAT_MIN, SummaryTable

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class KeyGeometry:
    """How the keys of one model's KV cache are laid out and position-encoded."""

    n_layer: int  # attention layers, in the order of the state blob
    n_head_kv: int
    head_dim: int
    k_type: GgmlType
    rope: RopeParams
    k_rotation: int  # 0: K stored plain; else the Hadamard chunk size (cache holds H.RoPE(k))

    def __post_init__(self) -> None:
        if self.n_layer <= 0 or self.n_head_kv <= 0 or self.head_dim <= 0:
            raise MemoryLayoutError(f"invalid key geometry {self}")
        if self.rope.n_rot > self.head_dim:
            raise MemoryLayoutError(f"n_rot={self.rope.n_rot} > head_dim={self.head_dim}")
        if self.k_rotation < 0 or (self.k_rotation and self.head_dim % self.k_rotation):
            raise MemoryLayoutError(
                f"k_rotation={self.k_rotation} does not divide head_dim={self.head_dim}"
            )

    @property
    def n_embd_k(self) -> int:
        """Elements of one K row (all KV heads of a token)."""
        return self.n_head_kv * self.head_dim

    @property
    def k_row_bytes(self) -> int:
        return self.k_type.row_bytes(self.n_embd_k)


# Tokens summarized at once. A batch's float32 temporaries hold n_tokens x n_scored x n_kv x
# head_dim values each (3.9 MB for 128 tokens of a 16-layer, 8-KV-head, 64-dim model), and
# large ones are fresh mappings on every call. On a 2-core VM, 28 such blocks took 4.6 s in
# one batch (huge-page first touch: see engine/transfer/host_pages.py); in slices of this
# size, reused from the heap and in cache, a block takes 3 ms, and 8 warm blocks took 22 ms
# against 42 ms in one warm batch.
SLICE_TOKENS = 128

DEFAULT_SCORED_LAYERS = 23  # layers 1..23 of a 24-layer model: measured best on Qwen2.5-0.5B


def _stats_over_tokens(content: np.ndarray, axis: int) -> np.ndarray:
    """float32 (mean, min, max) over the token `axis`, stacked on a new axis at `axis`."""
    mean = content.mean(axis=axis, dtype=np.float64).astype(np.float32)
    return np.stack([mean, content.min(axis=axis), content.max(axis=axis)], axis=axis)


def default_score_layers(n_layer: int, count: int = DEFAULT_SCORED_LAYERS) -> tuple[int, ...]:
    """`count` attention layers spread evenly over layers 1 .. n_layer - 1 (all of them
    when there are fewer; layer 0 only for a one-layer model).

    Summarizing and scoring cost grows with the layers used; the spread caps it on deep
    models. 23 layers (every layer but the first of Qwen2.5-0.5B) with the max aggregate
    ranked best on the real-model protocol (docs/benchmarks.md); 8 spread layers lost 6 of
    20 needles at 28K.
    """
    if n_layer <= 1:
        return (0,)
    if n_layer <= count + 1:
        return tuple(range(1, n_layer))
    picks = np.linspace(1, n_layer - 1, count)  # [count]
    return tuple(sorted({int(round(float(x))) for x in picks}))


@dataclass(frozen=True, slots=True)
class BlockKeys:
    """The keys of one block, as the host store holds them."""

    block_id: int
    positions: np.ndarray  # int [n_tokens]
    k_rows: Sequence[np.ndarray]  # per attention layer: uint8 [n_tokens, k_row_bytes]


class RetrievalIndex:
    """Content-frame key summaries of the blocks in the history, for the layers scored.

    Every read goes through `_sync` first (a no-op here; `BackgroundIndex` stores its
    pending summaries there), so readers see every summary added before them.
    """

    def __init__(self, geometry: KeyGeometry, layers: Sequence[int]) -> None:
        chosen = tuple(int(layer) for layer in layers)
        if not chosen:
            raise MemoryLayoutError("a retrieval index needs at least one scored layer")
        if len(set(chosen)) != len(chosen) or not all(
            0 <= layer < geometry.n_layer for layer in chosen
        ):
            raise MemoryLayoutError(
                f"scored layers {chosen} must be distinct and in [0, {geometry.n_layer})"
            )
        self._geometry = geometry
        self._layers = chosen
        self._table = SummaryTable(len(chosen), geometry.n_head_kv, geometry.head_dim)

    @property
    def geometry(self) -> KeyGeometry:
        return self._geometry

    @property
    def layers(self) -> tuple[int, ...]:
        """The attention-layer indices scored, in the order of the summaries' layer axis."""
        return self._layers

    def add(self, block_id: int, positions: np.ndarray, k_rows: Sequence[np.ndarray]) -> None:
        """Summarize one block (replacing an earlier summary of the same id).

        positions int [n_tokens]; k_rows per attention layer (all of them, like
        BlockKV.k), uint8 [n_tokens, k_row_bytes].
        """
        self.add_blocks([BlockKeys(block_id, positions, k_rows)])

    def add_blocks(self, blocks: Sequence[BlockKeys]) -> None:
        """Summarize several blocks at once (one dequantization and RoPE pass)."""
        self.put([b.block_id for b in blocks], self.summarize(blocks))

    def summarize(self, blocks: Sequence[BlockKeys]) -> np.ndarray:
        """float32 [n_blocks, 3, n_scored, n_head_kv, head_dim]: the blocks' (mean, min,
        max) content keys.

        Pure (reads only the geometry), so it may run on another thread than the index.
        Blocks of equal length are processed in one batch.
        """
        if not blocks:
            return np.zeros((0, *self._table.stats_shape), dtype=np.float32)
        n_tokens = {len(b.positions) for b in blocks}
        if len(n_tokens) != 1:
            return np.stack([self._block_summary(b.positions, b.k_rows) for b in blocks])
        n = n_tokens.pop()
        step = max(1, SLICE_TOKENS // max(n, 1))  # n = 0 is refused by _content_keys
        if len(blocks) > step:  # bounded temporaries: see SLICE_TOKENS
            parts = [self.summarize(blocks[i : i + step]) for i in range(0, len(blocks), step)]
            return np.concatenate(parts)  # [n_blocks, 3, n_scored, n_head_kv, head_dim]
        positions = np.concatenate([np.asarray(b.positions) for b in blocks])  # [n_blocks * n]
        k_rows = [
            np.concatenate([b.k_rows[layer] for b in blocks])
            if layer in self._layers
            else blocks[0].k_rows[layer]
            for layer in range(len(blocks[0].k_rows))
        ]  # per layer: [n_blocks * n, k_row_bytes] (only the scored layers are used)
        content = self._content_keys(positions, k_rows)  # [n_blocks*n, n_scored, n_kv, hd]
        per_block = content.reshape(len(blocks), n, *content.shape[1:])
        return _stats_over_tokens(per_block, axis=1)  # [n_blocks, 3, n_scored, n_kv, hd]

    def put(self, block_ids: Sequence[int], stats: np.ndarray) -> None:
        """Store summaries made by `summarize` (stats: [n_blocks, 3, n_scored, n_kv, hd])."""
        self._table.put(block_ids, stats)

    def remove(self, block_ids: Iterable[int]) -> None:
        """Forget blocks; ids not in the index are ignored."""
        self._sync()
        self._table.remove(block_ids)

    def __contains__(self, block_id: object) -> bool:
        self._sync()
        return block_id in self._table

    def __len__(self) -> int:
        self._sync()
        return len(self._table)

    def block_ids(self) -> tuple[int, ...]:
        self._sync()
        return self._table.block_ids()

    def means(self, block_ids: Sequence[int]) -> np.ndarray:
        """float32 [n_blocks, n_layers_scored, n_head_kv, head_dim], a new array."""
        return self.stats(block_ids)[:, STAT_MEAN]

    def bounds(self, block_ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """Per-channel (min, max) of the content keys: two float32
        [n_blocks, n_layers_scored, n_head_kv, head_dim] arrays."""
        stats = self.stats(block_ids)  # [n_blocks, 3, n_scored, n_kv, head_dim]
        return stats[:, STAT_MIN], stats[:, STAT_MAX]

    def stats(self, block_ids: Sequence[int]) -> np.ndarray:
        """float32 [n_blocks, 3, n_scored, n_kv, head_dim] (mean, min, max), a new array."""
        self._sync()
        return self._table.stats(block_ids)

    def score_table(self, block_ids: Sequence[int] | None = None) -> SummaryTable:
        """The summaries as scoring reads them (per layer and KV head, one row per block),
        holding every block of `block_ids` (None: every block added so far)."""
        if block_ids is None:
            self._sync()
        else:
            self._sync_blocks(block_ids)
        return self._table

    @property
    def nbytes(self) -> int:
        """Bytes allocated for the summaries (capacity, not only the rows in use)."""
        return self._table.nbytes

    def _sync(self) -> None:
        """Make every summary added so far readable (synchronous here)."""

    def _sync_blocks(self, block_ids: Sequence[int]) -> None:
        """Make the summaries of `block_ids` readable (others may still be pending)."""
        self._sync()

    # internals ---------------------------------------------------------------------

    def _block_summary(self, positions: np.ndarray, k_rows: Sequence[np.ndarray]) -> np.ndarray:
        content = self._content_keys(positions, k_rows)  # [n_tokens, n_scored, n_kv, head_dim]
        return _stats_over_tokens(content, axis=0)  # [3, n_scored, n_head_kv, head_dim]

    def _content_keys(self, positions: np.ndarray, k_rows: Sequence[np.ndarray]) -> np.ndarray:
        """float32 [n_tokens, n_scored, n_head_kv, head_dim]: keys with RoPE removed."""
        g = self._geometry
        pos = np.asarray(positions)  # [n_tokens]
        n_tokens = pos.shape[0] if pos.ndim == 1 else -1
        if n_tokens <= 0:
            raise MemoryLayoutError(
                f"positions must be a non-empty [n_tokens] array, got {pos.shape}"
            )
        if len(k_rows) != g.n_layer:
            raise MemoryLayoutError(f"{len(k_rows)} K layers, the geometry has {g.n_layer}")
        for layer in self._layers:
            rows = k_rows[layer]
            if rows.shape != (n_tokens, g.k_row_bytes):
                raise MemoryLayoutError(
                    f"K layer {layer}: rows {list(rows.shape)}, expected [{n_tokens}, {g.k_row_bytes}]"
                )
        n_scored = len(self._layers)
        # [n_tokens, n_scored, k_row_bytes]
        stacked = np.stack([k_rows[layer] for layer in self._layers], axis=1)
        flat = stacked.reshape(n_tokens * n_scored, g.k_row_bytes)  # [n_tokens*n_scored, row_bytes]
        keys = dequantize_rows(flat, g.k_type, g.n_embd_k)  # [n_tokens * n_scored, n_embd_k]
        # [n_tokens, n_scored, n_head_kv, head_dim]
        keys = keys.reshape(n_tokens, n_scored, g.n_head_kv, g.head_dim)
        if g.k_rotation:
            keys = undo_hadamard(keys, g.k_rotation)
        return remove_rope(keys, pos, g.rope)  # [n_tokens, n_scored, n_head_kv, head_dim]
