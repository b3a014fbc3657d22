"""The llama.cpp sequence-state blob: parse it, split it per block, rebuild it.

Layout written by `llama_state_seq_get_data` for a plain (unified) KV cache
(llama-context.cpp / llama-kv-cache.cpp `state_write*`):

    u32 magic (0xaf143cd8), i32 seq_id, u32 n_stream,
    per stream: u32 cell_count, then if cell_count > 0:
        cell_count x (i32 pos, u32 n_seq_id, n_seq_id x i32 seq_id)
        u32 v_trans, u32 n_layer,
        per layer: i32 k_type, u64 k_row_bytes, cell_count rows of K
        v_trans == 0: per layer: i32 v_type, u64 v_row_bytes, cell_count rows of V
        v_trans == 1: per layer: i32 v_type, u32 v_el_bytes, u32 n_embd_v, then
                      n_embd_v x cell_count elements (V transposed)

With M-RoPE (IMROPE: qwen35) every cell also carries an extension after n_seq_id:
`i32 x, i32 y, i32 tok` (`llama_kv_cell_ext`); the blob does not say so, the model does
(`cell_ext=True`). A hybrid memory writes this attention part and then its recurrent part
(hybrid_codec.py). Anything else (several streams, hybrid/recurrent parts passed to
`parse_state`, a size mismatch) raises StateFormatError. Rows are kept as raw bytes in the
cache's own type; transposed V is turned into per-cell rows so blocks split and join the
same way.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np

from kvmem.errors import StateFormatError
from kvmem.memory.ggml_types import GgmlType
from kvmem.memory.host_store import BlockKV

from .kv_copy import NativeCopy
from .state_writer import StateWriter

STATE_MAGIC = 0xAF143CD8
CELL_EXT_INTS = 3  # llama_kv_cell_ext: x, y, tok


@dataclass(frozen=True, slots=True)
class LayerLayout:
    k_type: GgmlType
    k_row_bytes: int
    v_type: GgmlType
    v_row_bytes: int  # bytes of one cell's V (per-cell row, also when stored transposed)
    v_el_bytes: int  # element size when transposed (0 otherwise)


@dataclass(frozen=True, slots=True)
class StateLayout:
    """The per-layer K/V row layout of one context's cache."""

    v_trans: bool
    layers: tuple[LayerLayout, ...]
    cell_ext: bool = False  # cells carry llama_kv_cell_ext (M-RoPE models)


@dataclass(slots=True)
class SeqState:
    """A parsed sequence-state blob."""

    layout: StateLayout
    positions: np.ndarray  # int32 [n_cells], in cache order
    k: list[np.ndarray]  # per layer, uint8 [n_cells, k_row_bytes]
    v: list[np.ndarray]  # per layer, uint8 [n_cells, v_row_bytes]; empty when v_cols is set
    ext: np.ndarray | None = None  # int32 [n_cells, 3] (x, y, tok) when layout.cell_ext
    # per layer, uint8 [n_embd_v, n_cells, el]: transposed V as the blob holds it (views),
    # when parsed with transpose_v=False (the native harvest split reads it directly)
    v_cols: list[np.ndarray] | None = None


class StateReader:
    def __init__(self, blob: bytes | memoryview) -> None:
        self.buf = memoryview(blob)
        self.off = 0

    def unpack(self, fmt: str) -> tuple:
        size = struct.calcsize(fmt)
        if self.off + size > len(self.buf):
            raise StateFormatError("sequence state ends early")
        values = struct.unpack_from(fmt, self.buf, self.off)
        self.off += size
        return values

    def array(self, n_bytes: int) -> np.ndarray:
        if self.off + n_bytes > len(self.buf):
            raise StateFormatError("sequence state ends early")
        out = np.frombuffer(self.buf, dtype=np.uint8, count=n_bytes, offset=self.off)
        self.off += n_bytes
        return out

    @property
    def left(self) -> int:
        return len(self.buf) - self.off


def ggml_type_of(value: int) -> GgmlType:
    try:
        return GgmlType(value)
    except ValueError:
        raise StateFormatError(f"state type {value} is not supported") from None


def read_header(r: StateReader) -> int:
    """The blob's `u32 magic, i32 seq_id`; returns the seq id."""
    magic, seq_id = r.unpack("<Ii")
    if magic != STATE_MAGIC:
        raise StateFormatError(f"unknown sequence state magic {magic:#x}")
    return int(seq_id)


def parse_state(
    blob: bytes | memoryview, *, cell_ext: bool = False, transpose_v: bool = True
) -> SeqState:
    """Parse a blob from llama_state_seq_get_data of a plain KV cache; refuses layouts it
    does not know (a hybrid blob: use hybrid_codec.parse_hybrid_state). With
    transpose_v=False, transposed V stays in the blob (`SeqState.v_cols`)."""
    r = StateReader(blob)
    read_header(r)
    state = read_kv_part(r, cell_ext, transpose_v)
    if r.left:
        raise StateFormatError(
            f"{r.left} unexpected bytes after the KV data (hybrid or recurrent memory?)"
        )
    return state


def read_kv_part(r: StateReader, cell_ext: bool, transpose_v: bool = True) -> SeqState:
    """The attention-cache part of a blob, from `u32 n_stream` on."""
    (n_stream,) = r.unpack("<I")
    if n_stream != 1:
        raise StateFormatError(f"{n_stream} KV streams; KVMem needs a unified cache (kv_unified)")
    (n_cells,) = r.unpack("<I")
    if n_cells == 0:
        return SeqState(StateLayout(False, (), cell_ext), np.zeros(0, np.int32), [], [])
    n_ints = 3 + (CELL_EXT_INTS if cell_ext else 0)  # pos, n_seq_id, [x, y, tok], seq_id
    meta = r.array(n_cells * 4 * n_ints).view("<i4").reshape(n_cells, n_ints)
    if not np.all(meta[:, 1] == 1):
        raise StateFormatError(
            "cells with several sequence ids, or cell extensions the model did not announce"
        )
    positions = meta[:, 0].astype(np.int32)  # [n_cells]
    ext = meta[:, 2 : 2 + CELL_EXT_INTS].astype(np.int32) if cell_ext else None  # [n_cells, 3]
    v_trans, n_layer = r.unpack("<II")
    if v_trans > 1 or n_layer == 0 or n_layer > 4096:
        raise StateFormatError(
            f"implausible KV header (v_trans {v_trans}, {n_layer} layers): cell extensions "
            "the model did not announce, or an unknown memory type"
        )
    k_rows, k_meta = [], []
    for _ in range(n_layer):
        k_type, k_row = r.unpack("<iQ")
        k_meta.append((ggml_type_of(k_type), k_row))
        k_rows.append(r.array(n_cells * k_row).reshape(n_cells, k_row))
    v_rows, v_cols, layers = [], [], []
    for k_type, k_row in k_meta:
        if v_trans:
            v_type, el, n_embd_v = r.unpack("<iII")
            data = r.array(n_embd_v * n_cells * el).reshape(n_embd_v, n_cells, el)
            layers.append(LayerLayout(k_type, k_row, ggml_type_of(v_type), n_embd_v * el, el))
            if not transpose_v:
                v_cols.append(data)
                continue
            rows = np.ascontiguousarray(data.transpose(1, 0, 2)).reshape(n_cells, n_embd_v * el)
        else:
            v_type, v_row = r.unpack("<iQ")
            rows = r.array(n_cells * v_row).reshape(n_cells, v_row)
            layers.append(LayerLayout(k_type, k_row, ggml_type_of(v_type), v_row, 0))
        v_rows.append(rows)
    layout = StateLayout(bool(v_trans), tuple(layers), cell_ext)
    return SeqState(layout, positions, k_rows, v_rows, ext, v_cols if v_cols else None)


def split_blocks(state: SeqState, block_tokens: int) -> list[BlockKV]:
    """Group a state's cells into blocks of `block_tokens` positions, sorted by position."""
    order = np.argsort(state.positions, kind="stable")  # [n_cells]
    positions = state.positions[order]  # [n_cells]
    block_of = positions // block_tokens  # [n_cells]
    bounds = np.flatnonzero(np.diff(block_of)) + 1
    blocks = []
    for idx in np.split(np.arange(len(order)), bounds):
        if len(idx) == 0:
            continue
        cells = _cell_selector(order[idx])
        blocks.append(
            BlockKV(
                block_id=int(block_of[idx[0]]),
                positions=positions[idx].astype(np.int32),
                k=[np.ascontiguousarray(k[cells]) for k in state.k],
                v=[np.ascontiguousarray(v[cells]) for v in state.v],
                ext=None if state.ext is None else np.ascontiguousarray(state.ext[cells]),
            )
        )
    return blocks


def _cell_selector(cells: np.ndarray) -> slice | np.ndarray:
    """A slice when the cells are one ascending run (zero-copy views of the state), else
    the index array (a gather)."""
    first, last = int(cells[0]), int(cells[-1])
    if last - first + 1 == len(cells) and bool(np.all(np.diff(cells) == 1)):
        return slice(first, last + 1)
    return cells


def build_state(
    layout: StateLayout,
    blocks: Sequence[BlockKV],
    seq_id: int,
    out: np.ndarray | None = None,
    copier: Executor | None = None,
    native: NativeCopy | None = None,
) -> np.ndarray:
    """A blob that `llama_state_seq_set_data` restores as the cells of `blocks`: uint8
    [n_bytes], written in place (each K/V byte is copied once, straight into the blob);
    into `out` (uint8, exactly that size) when given. With `native`, every K/V section is
    copied in one native call (kv_copy); else with `copier`, on its threads (the bytes are
    the same)."""
    n_cells = sum(b.n_tokens for b in blocks)
    n_bytes = 8 + kv_part_nbytes(layout, n_cells)
    if out is None:
        out = np.empty(n_bytes, dtype=np.uint8)  # [n_bytes]
    elif out.shape != (n_bytes,) or out.dtype != np.uint8:
        raise StateFormatError(f"blob buffer of {out.shape} for a {n_bytes}-byte state")
    writer = StateWriter(out, copier, native)
    writer.put(struct.pack("<Ii", STATE_MAGIC, seq_id))
    try:
        write_kv_part(writer, layout, blocks, seq_id)
    finally:
        writer.finish()
    assert writer.at == len(out)
    return out


def serialize_state(state: SeqState, seq_id: int) -> np.ndarray:
    """The blob `state` was parsed from (cells in the same order): uint8 [n_bytes]."""
    return build_state(state.layout, [_as_block(state)] if len(state.positions) else [], seq_id)


def _as_block(state: SeqState) -> BlockKV:
    return BlockKV(-1, state.positions, state.k, state.v, state.ext)


def kv_part_nbytes(layout: StateLayout, n_cells: int) -> int:
    """Bytes of the attention part (from n_stream on) holding n_cells cells."""
    if n_cells == 0:
        return 8  # n_stream, cell_count
    n_ints = 3 + (CELL_EXT_INTS if layout.cell_ext else 0)
    heads = 8 + 24 * len(layout.layers)  # v_trans, n_layer; per layer a K and a V header
    rows = n_cells * sum(lay.k_row_bytes + lay.v_row_bytes for lay in layout.layers)
    return 8 + n_cells * 4 * n_ints + heads + rows


def write_kv_part(
    writer: StateWriter, layout: StateLayout, blocks: Sequence[BlockKV], seq_id: int
) -> None:
    """Write the attention part (n_stream, cells, K, V) of `blocks` in the given order."""
    n_cells = sum(b.n_tokens for b in blocks)
    writer.put(struct.pack("<II", 1, n_cells))
    if n_cells == 0:
        return
    positions = np.concatenate([b.positions for b in blocks]).astype(np.int32)  # [n_cells]
    n_ints = 3 + (CELL_EXT_INTS if layout.cell_ext else 0)
    meta = np.empty((n_cells, n_ints), dtype=np.int32)  # [n_cells, (pos, n_seq, [ext], seq)]
    meta[:, 0] = positions
    meta[:, 1] = 1
    meta[:, -1] = seq_id
    if layout.cell_ext:
        if any(b.ext is None for b in blocks):
            raise StateFormatError("the cache needs cell extensions the blocks do not carry")
        meta[:, 2 : 2 + CELL_EXT_INTS] = np.concatenate([b.ext for b in blocks])  # type: ignore[misc]
    writer.put(meta.tobytes())
    writer.put(struct.pack("<II", int(layout.v_trans), len(layout.layers)))
    for i, lay in enumerate(layout.layers):
        writer.put(struct.pack("<iQ", int(lay.k_type), lay.k_row_bytes))
        writer.rows([b.k[i] for b in blocks], n_cells, lay.k_row_bytes)
    for i, lay in enumerate(layout.layers):
        if layout.v_trans:
            n_embd_v = lay.v_row_bytes // lay.v_el_bytes
            writer.put(struct.pack("<iII", int(lay.v_type), lay.v_el_bytes, n_embd_v))
            writer.columns([b.v[i] for b in blocks], n_cells, lay.v_row_bytes, lay.v_el_bytes)
        else:
            writer.put(struct.pack("<iQ", int(lay.v_type), lay.v_row_bytes))
            writer.rows([b.v[i] for b in blocks], n_cells, lay.v_row_bytes)
