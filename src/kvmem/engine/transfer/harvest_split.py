"""The harvest copy-out in one native call: a parsed state blob into blocks that own their
memory.

`split_blocks` (state_codec) + `owned_block` (below) are the numpy path and the
reference: group the cells by block (sorted by position), then copy each block's rows of
every layer into one buffer of its own (all layers' K rows, then V rows). Here the same
bytes land in the same places, but every copy is an op of one `CopyPlan`: per block, layer
and run of cells that are consecutive in the blob, one contiguous copy of K and of V (or,
for transposed V, one strided copy from the blob's channels x cells layout). The blocks
are returned at once, as views of their buffers; they hold their bytes only after the
plan has run.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kvmem.memory.host_store import BlockKV

from .block_buffers import BlockBuffers, take_buffer
from .kv_copy import CopyPlan, address
from .state_codec import SeqState


def owned_block(block: BlockKV, buffers: BlockBuffers | None = None) -> BlockKV:
    """A copy of `block` packed into one buffer of its own: K then V rows of every layer,
    each array a view of that buffer (the state blob it came from may be reused). The
    buffer comes from `buffers` (pages touched ahead) when given."""
    arrays = [*block.k, *block.v]
    n_bytes = sum(a.nbytes for a in arrays)
    buf = take_buffer(buffers, n_bytes)  # uint8 [n_bytes]
    views, at = [], 0
    for a in arrays:
        view = buf[at : at + a.nbytes].reshape(a.shape)  # uint8 [n_tokens, row_bytes]
        view[...] = a
        views.append(view)
        at += a.nbytes
    n_layer = len(block.k)
    return BlockKV(
        block_id=block.block_id,
        positions=np.array(block.positions, dtype=np.int32),  # [n_tokens]
        k=views[:n_layer],
        v=views[n_layer:],
        ext=None if block.ext is None else np.array(block.ext, order="C"),
    )


def split_owned(
    state: SeqState, block_tokens: int, take: Callable[[int], np.ndarray], plan: CopyPlan
) -> list[BlockKV]:
    """The state's cells as blocks (sorted by position, as `split_blocks`), each in a
    buffer from `take(n_bytes)` (uint8), filled by `plan` when it runs."""
    n_cells = len(state.positions)
    if n_cells == 0:
        return []
    order = np.argsort(state.positions, kind="stable")  # [n_cells] blob cell of each rank
    positions = state.positions[order]  # [n_cells]
    block_of = positions // block_tokens  # [n_cells]
    starts = np.flatnonzero(np.r_[True, np.diff(block_of) != 0])  # [n_blocks] first rank
    lengths = np.diff(np.r_[starts, n_cells])  # [n_blocks]
    # runs: ranks where a new block starts or the blob cell is not the previous one's + 1
    run_at = np.flatnonzero(np.r_[True, (np.diff(block_of) != 0) | (np.diff(order) != 1)])
    run_len = np.diff(np.r_[run_at, n_cells]).astype(np.uint64)  # [n_runs]
    run_block = np.searchsorted(starts, run_at, side="right") - 1  # [n_runs]
    run_j0 = (run_at - starts[run_block]).astype(np.uint64)  # [n_runs] first cell in block
    run_c0 = order[run_at].astype(np.uint64)  # [n_runs] first blob cell

    layers = state.layout.layers
    k_row = np.array([lay.k_row_bytes for lay in layers], dtype=np.uint64)  # [n_layer]
    v_row = np.array([lay.v_row_bytes for lay in layers], dtype=np.uint64)  # [n_layer]
    cell_bytes = int(k_row.sum() + v_row.sum())
    k_off = np.cumsum(k_row) - k_row  # [n_layer] per-cell offset of layer l's K section
    v_off = int(k_row.sum()) + np.cumsum(v_row) - v_row  # [n_layer] ... of its V section

    buffers = [take(int(n) * cell_bytes) for n in lengths]
    bases = np.array([address(b) for b in buffers], dtype=np.uint64)  # [n_blocks]
    n_run_block = lengths[run_block].astype(np.uint64)[:, None]  # [n_runs, 1]
    dst0 = bases[run_block][:, None]  # [n_runs, 1]
    j0, c0, n = run_j0[:, None], run_c0[:, None], run_len[:, None]  # [n_runs, 1] each

    k_src = np.array([address(k) for k in state.k], dtype=np.uint64)  # [n_layer]
    plan.add(dst0 + n_run_block * k_off + j0 * k_row, k_src + c0 * k_row, n * k_row)
    v_dst = dst0 + n_run_block * v_off + j0 * v_row  # [n_runs, n_layer]
    if state.v_cols is None:
        v_src = np.array([address(v) for v in state.v], dtype=np.uint64)  # [n_layer]
        plan.add(v_dst, v_src + c0 * v_row, n * v_row)
    else:
        _add_columns(plan, state, v_dst, run_c0, run_len)

    blocks = []
    for b, (first, n_tok) in enumerate(zip(starts.tolist(), lengths.tolist(), strict=True)):
        cells = order[first : first + n_tok]  # [n_tok] blob cells of this block
        blocks.append(
            BlockKV(
                block_id=int(block_of[first]),
                positions=positions[first : first + n_tok].astype(np.int32),
                k=_views(buffers[b], n_tok, k_off, k_row),
                v=_views(buffers[b], n_tok, v_off, v_row),
                ext=None if state.ext is None else np.ascontiguousarray(state.ext[cells]),
            )
        )
    return blocks


def _add_columns(
    plan: CopyPlan, state: SeqState, v_dst: np.ndarray, c0: np.ndarray, n: np.ndarray
) -> None:
    """Strided ops reading transposed V (channels x cells) into per-cell rows: one per
    run and layer (v_dst: uint64 [n_runs, n_layer] destination of the run's first row)."""
    assert state.v_cols is not None
    for layer, cols in enumerate(state.v_cols):
        n_embd_v, n_cells, el = cols.shape
        plan.add(
            v_dst[:, layer],
            address(cols) + c0 * np.uint64(el),
            el,
            n_outer=n_embd_v,
            n_inner=n,
            strides=(el, n_cells * el, n_embd_v * el, el),
        )


def _views(buf: np.ndarray, n_tok: int, offsets: np.ndarray, rows: np.ndarray) -> list[np.ndarray]:
    """Per layer uint8 [n_tok, row] views of a block's buffer at n_tok * offset."""
    return [
        buf[n_tok * o : n_tok * (o + r)].reshape(n_tok, r)
        for o, r in zip(offsets.tolist(), rows.tolist(), strict=True)
    ]
