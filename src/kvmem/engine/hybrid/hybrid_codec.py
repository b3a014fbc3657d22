"""Sequence-state blobs of hybrid memories (attention layers + recurrent layers).

A hybrid memory (`llama_memory_hybrid`, e.g. qwen35) writes, after `u32 magic, i32 seq_id`,
its attention part (state_codec.read_kv_part) and then its recurrent part; with
LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY only the recurrent part. The recurrent part
(llama-memory-recurrent.cpp `state_write*`), for one sequence:

    u32 cell_count,
    cell_count x (i32 pos, u32 n_seq_id = 0),
    u32 s_trans (0), u32 n_layer (every trunk layer, recurrent or not),
    per recurrent layer: i32 r_type, u64 r_row_bytes, cell_count rows of R (conv state)
    per recurrent layer: i32 s_type, u64 s_row_bytes, cell_count rows of S (delta-net state)

The blob does not count the recurrent layers: the entries run to the end of the blob, the
first half R and the second half S, every R row the same size (n_embd_r) and every S row the
same size (n_embd_s); a full hybrid blob also pins the count (n_layer minus the attention
part's layers). Anything else raises StateFormatError naming what was found.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvmem.errors import StateFormatError
from kvmem.memory.ggml_types import GgmlType
from kvmem.memory.host_store import BlockKV

from ..transfer.state_codec import (
    STATE_MAGIC,
    SeqState,
    StateLayout,
    StateReader,
    ggml_type_of,
    kv_part_nbytes,
    read_header,
    read_kv_part,
    write_kv_part,
)
from ..transfer.state_writer import StateWriter


@dataclass(frozen=True, slots=True)
class RecurrentLayout:
    n_layer: int  # the header's n_layer: all trunk layers, attention ones included
    r: tuple[tuple[GgmlType, int], ...]  # per recurrent layer: (type, row bytes) of R
    s: tuple[tuple[GgmlType, int], ...]  # per recurrent layer: (type, row bytes) of S

    @property
    def n_recurrent(self) -> int:
        return len(self.r)


@dataclass(slots=True)
class RecurrentState:
    """The recurrent part of one sequence: its cell(s) and each recurrent layer's rows."""

    layout: RecurrentLayout
    positions: np.ndarray  # int32 [n_cells]: the last position each cell has seen
    r: list[np.ndarray]  # per recurrent layer, uint8 [n_cells, r_row_bytes]
    s: list[np.ndarray]  # per recurrent layer, uint8 [n_cells, s_row_bytes]

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.r) + sum(int(a.nbytes) for a in self.s)

    def same_as(self, other: RecurrentState) -> bool:
        """Bit-for-bit equality (layout, positions and every row)."""
        return (
            self.layout == other.layout
            and np.array_equal(self.positions, other.positions)
            and all(np.array_equal(a, b) for a, b in zip(self.r, other.r, strict=True))
            and all(np.array_equal(a, b) for a, b in zip(self.s, other.s, strict=True))
        )


@dataclass(slots=True)
class HybridSeqState:
    seq_id: int
    attn: SeqState
    recurrent: RecurrentState


@dataclass(slots=True)
class PartialSeqState:
    """A PARTIAL_ONLY blob: the recurrent part alone."""

    seq_id: int
    recurrent: RecurrentState


def parse_hybrid_state(blob: bytes | memoryview, *, cell_ext: bool) -> HybridSeqState:
    """Parse a hybrid memory's full blob (attention part, then recurrent part)."""
    r = StateReader(blob)
    seq_id = read_header(r)
    attn = read_kv_part(r, cell_ext)
    recurrent = read_recurrent_part(r, n_attention=len(attn.layout.layers) or None)
    return HybridSeqState(seq_id, attn, recurrent)


def parse_partial_state(
    blob: bytes | memoryview, expect: RecurrentLayout | None = None
) -> PartialSeqState:
    """Parse a PARTIAL_ONLY blob; with `expect`, its layout must be exactly that one."""
    r = StateReader(blob)
    seq_id = read_header(r)
    recurrent = read_recurrent_part(r, n_attention=None)
    if expect is not None and recurrent.layout != expect:
        raise StateFormatError(
            f"recurrent layout {_describe(recurrent.layout)} is not the expected "
            f"{_describe(expect)}"
        )
    return PartialSeqState(seq_id, recurrent)


def read_recurrent_part(r: StateReader, n_attention: int | None) -> RecurrentState:
    """The recurrent part, which must run to the end of the blob. `n_attention`: the
    attention layers of the same memory (pins the recurrent count to n_layer - n_attention)."""
    (n_cells,) = r.unpack("<I")
    if n_cells > 64:
        raise StateFormatError(f"{n_cells} recurrent cells for one sequence: not a recurrent part")
    meta = r.array(n_cells * 8).view("<i4").reshape(n_cells, 2)  # [n_cells, (pos, n_seq_id)]
    if np.any(meta[:, 1] != 0):
        raise StateFormatError(
            "recurrent cells list sequence ids: a whole-memory blob, not one sequence's"
        )
    positions = meta[:, 0].astype(np.int32)  # [n_cells]
    s_trans, n_layer = r.unpack("<II")
    if s_trans != 0:
        raise StateFormatError(
            f"unknown recurrent layout: s_trans = {s_trans} (llama.cpp writes 0; "
            "an attention part where a recurrent part should be?)"
        )
    if n_layer == 0 or n_layer > 4096:
        raise StateFormatError(f"implausible recurrent header: {n_layer} layers")
    entries: list[tuple[GgmlType, int, np.ndarray]] = []
    while r.left:
        type_id, row = r.unpack("<iQ")
        if row == 0 or row > 1 << 34:
            raise StateFormatError(f"implausible recurrent row size {row} in entry {len(entries)}")
        rows = r.array(n_cells * row).reshape(n_cells, row)  # [n_cells, row]
        entries.append((ggml_type_of(type_id), int(row), rows))
    n_entries = len(entries)
    if n_entries == 0 or n_entries % 2 or n_entries // 2 > n_layer:
        raise StateFormatError(
            f"{n_entries} recurrent tensors for {n_layer} layers: expected an R and an S "
            "tensor per recurrent layer (an unknown recurrent layout?)"
        )
    half = n_entries // 2
    if n_attention is not None and half != n_layer - n_attention:
        raise StateFormatError(
            f"{half} recurrent layers, but {n_layer} layers minus {n_attention} attention "
            f"layers leave {n_layer - n_attention}"
        )
    r_part, s_part = entries[:half], entries[half:]
    for name, part in (("R", r_part), ("S", s_part)):
        if len({(t, row) for t, row, _ in part}) != 1:
            found = sorted({(t.name, row) for t, row, _ in part})
            raise StateFormatError(f"recurrent {name} tensors differ in type or row size: {found}")
    layout = RecurrentLayout(
        n_layer=int(n_layer),
        r=tuple((t, row) for t, row, _ in r_part),
        s=tuple((t, row) for t, row, _ in s_part),
    )
    return RecurrentState(
        layout, positions, [rows for *_, rows in r_part], [rows for *_, rows in s_part]
    )


def recurrent_part_nbytes(state: RecurrentState) -> int:
    n_cells = len(state.positions)
    heads = 4 + 8 * n_cells + 8 + 12 * 2 * state.layout.n_recurrent
    return heads + state.nbytes


def write_recurrent_part(writer: StateWriter, state: RecurrentState) -> None:
    n_cells = len(state.positions)
    meta = np.zeros((n_cells, 2), dtype=np.int32)  # [n_cells, (pos, n_seq_id = 0)]
    meta[:, 0] = state.positions
    writer.put(struct.pack("<I", n_cells) + meta.tobytes())
    writer.put(struct.pack("<II", 0, state.layout.n_layer))
    for (t, row), rows in zip(state.layout.r + state.layout.s, state.r + state.s, strict=True):
        writer.put(struct.pack("<iQ", int(t), row))
        writer.rows([rows], n_cells, row)


def build_hybrid_state(
    layout: StateLayout, blocks: Sequence[BlockKV], seq_id: int, recurrent: RecurrentState
) -> np.ndarray:
    """A hybrid blob that `llama_state_seq_set_data` restores as the cells of `blocks` with
    `recurrent` as the sequence's recurrent state: uint8 [n_bytes]. Restoring attention
    blocks through a staging sequence and `seq_cp` hands the staging sequence's recurrent
    state to the target too, so pass the target's own (a PARTIAL_ONLY snapshot of it)."""
    n_cells = sum(b.n_tokens for b in blocks)
    size = 8 + kv_part_nbytes(layout, n_cells) + recurrent_part_nbytes(recurrent)
    out = np.empty(size, dtype=np.uint8)  # [n_bytes]
    writer = StateWriter(out)
    writer.put(struct.pack("<Ii", STATE_MAGIC, seq_id))
    write_kv_part(writer, layout, blocks, seq_id)
    write_recurrent_part(writer, recurrent)
    assert writer.at == size
    return out


def serialize_hybrid_state(state: HybridSeqState) -> np.ndarray:
    """The full blob of `state` (cells in parse order): uint8 [n_bytes]."""
    attn = state.attn
    blocks = [BlockKV(-1, attn.positions, attn.k, attn.v, attn.ext)] if len(attn.positions) else []
    return build_hybrid_state(attn.layout, blocks, state.seq_id, state.recurrent)


def serialize_partial_state(state: PartialSeqState) -> np.ndarray:
    """The PARTIAL_ONLY blob of `state`: uint8 [n_bytes]."""
    size = 8 + recurrent_part_nbytes(state.recurrent)
    out = np.empty(size, dtype=np.uint8)  # [n_bytes]
    writer = StateWriter(out)
    writer.put(struct.pack("<Ii", STATE_MAGIC, state.seq_id))
    write_recurrent_part(writer, state.recurrent)
    assert writer.at == size
    return out


def _describe(layout: RecurrentLayout) -> str:
    r = sorted({(t.name, row) for t, row in layout.r})
    s = sorted({(t.name, row) for t, row in layout.s})
    return f"({layout.n_recurrent} of {layout.n_layer} layers, R {r}, S {s})"
