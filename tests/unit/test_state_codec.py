"""The seq-state codec against hand-written blobs (no model)."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from kvmem.engine.transfer.state_codec import (
    STATE_MAGIC,
    LayerLayout,
    StateLayout,
    build_state,
    parse_state,
    serialize_state,
    split_blocks,
)
from kvmem.errors import StateFormatError
from kvmem.memory.block_table import block_runs
from kvmem.memory.ggml_types import GgmlType
from kvmem.memory.host_store import BlockKV

K_ROW, N_EMBD_V = 8, 4  # bytes of a K row; V elements per cell (f16: 2 bytes each)


def reference_blob(positions, k, v, v_trans: bool, seq_id: int = 1) -> bytes:
    """A blob written the way llama-kv-cache.cpp state_write does, one field at a time."""
    out = struct.pack("<IiII", STATE_MAGIC, seq_id, 1, len(positions))
    for p in positions:
        out += struct.pack("<iIi", p, 1, seq_id)
    out += struct.pack("<II", int(v_trans), len(k))
    for layer in k:
        out += struct.pack("<iQ", int(GgmlType.F16), K_ROW)
        out += b"".join(bytes(row) for row in layer)
    for layer in v:
        if v_trans:
            out += struct.pack("<iII", int(GgmlType.F16), 2, N_EMBD_V)
            for j in range(N_EMBD_V):  # element j of every cell, then element j+1 ...
                out += b"".join(bytes(row[2 * j : 2 * j + 2]) for row in layer)
        else:
            out += struct.pack("<iQ", int(GgmlType.F16), N_EMBD_V * 2)
            out += b"".join(bytes(row) for row in layer)
    return out


def sample(n_cells: int, positions: list[int]):
    rng = np.random.default_rng(0)
    k = [rng.integers(0, 255, (n_cells, K_ROW), dtype=np.uint8) for _ in range(2)]
    v = [rng.integers(0, 255, (n_cells, N_EMBD_V * 2), dtype=np.uint8) for _ in range(2)]
    return positions, k, v


@pytest.mark.parametrize("v_trans", [False, True])
def test_parse_matches_reference_layout(v_trans):
    positions, k, v = sample(5, [4, 0, 1, 7, 5])
    state = parse_state(reference_blob(positions, k, v, v_trans))
    assert state.positions.tolist() == positions
    assert state.layout.v_trans is v_trans
    assert state.layout.layers[0] == LayerLayout(
        GgmlType.F16, K_ROW, GgmlType.F16, N_EMBD_V * 2, 2 if v_trans else 0
    )
    for layer in range(2):
        assert np.array_equal(state.k[layer], k[layer])
        assert np.array_equal(state.v[layer], v[layer])  # per-cell rows, also when transposed


@pytest.mark.parametrize("v_trans", [False, True])
def test_split_and_rebuild_round_trip(v_trans):
    positions, k, v = sample(6, [5, 0, 1, 4, 2, 3])
    state = parse_state(reference_blob(positions, k, v, v_trans))
    blocks = split_blocks(state, block_tokens=2)
    assert [b.block_id for b in blocks] == [0, 1, 2]
    assert [b.positions.tolist() for b in blocks] == [[0, 1], [2, 3], [4, 5]]
    # block 2 holds positions 4 and 5, which were cells 3 and 0 of the blob
    assert np.array_equal(blocks[2].k[1], k[1][[3, 0]])
    assert np.array_equal(blocks[2].v[0], v[0][[3, 0]])
    blob = build_state(state.layout, [blocks[0], blocks[2]], seq_id=2)
    order = [1, 2, 3, 0]  # cells of positions 0, 1, 4, 5
    expected = reference_blob(
        [positions[i] for i in order],
        [layer[order] for layer in k],
        [layer[order] for layer in v],
        v_trans,
        seq_id=2,
    )
    assert blob.dtype == np.uint8 and blob.tobytes() == expected


def test_refuses_unknown_layouts():
    positions, k, v = sample(2, [0, 1])
    good = reference_blob(positions, k, v, False)
    with pytest.raises(StateFormatError, match="magic"):
        parse_state(b"\0\0\0\0" + good[4:])
    with pytest.raises(StateFormatError, match="streams"):
        parse_state(good[:8] + struct.pack("<I", 2) + good[12:])
    with pytest.raises(StateFormatError, match="unexpected bytes"):
        parse_state(good + b"\x01\x02")
    with pytest.raises(StateFormatError, match="ends early"):
        parse_state(good[:-3])
    with pytest.raises(StateFormatError, match="not supported"):
        bad_type = bytearray(good)
        offset = 16 + 2 * 12 + 8  # header, cells, v_trans/n_layer -> first k_type
        bad_type[offset : offset + 4] = struct.pack("<i", 99)
        parse_state(bytes(bad_type))


def test_empty_state():
    state = parse_state(struct.pack("<IiII", STATE_MAGIC, 1, 1, 0))
    assert state.positions.size == 0 and split_blocks(state, 128) == []


def test_block_runs():
    assert block_runs([8, 1, 2, 3, 7]) == [range(1, 4), range(7, 9)]
    assert block_runs([]) == []
    assert block_runs([4]) == [range(4, 5)]


def test_build_state_header_counts_cells():
    layout = StateLayout(False, (LayerLayout(GgmlType.F16, K_ROW, GgmlType.F16, 8, 0),))
    block = BlockKV(
        block_id=0,
        positions=np.arange(2, dtype=np.int32),
        k=[np.zeros((2, K_ROW), np.uint8)],
        v=[np.zeros((2, 8), np.uint8)],
    )
    blob = build_state(layout, [block], seq_id=2)
    assert struct.unpack_from("<IiII", blob) == (STATE_MAGIC, 2, 1, 2)
    assert parse_state(blob).positions.tolist() == [0, 1]


def ext_blob(positions, ext, k, v, seq_id: int = 1) -> bytes:
    """A plain blob of an M-RoPE cache: each cell carries (x, y, tok) after n_seq_id."""
    out = struct.pack("<IiII", STATE_MAGIC, seq_id, 1, len(positions))
    for p, (x, y, tok) in zip(positions, ext, strict=True):
        out += struct.pack("<iIiiii", p, 1, x, y, tok, seq_id)
    out += struct.pack("<II", 0, len(k))
    for layer in k:
        out += struct.pack("<iQ", int(GgmlType.F16), K_ROW) + b"".join(bytes(r) for r in layer)
    for layer in v:
        out += struct.pack("<iQ", int(GgmlType.F16), N_EMBD_V * 2)
        out += b"".join(bytes(r) for r in layer)
    return out


def test_cell_extensions_parse_split_and_rebuild() -> None:
    positions, k, v = sample(4, [0, 1, 2, 3])
    ext = [[p, p, 100 + p] for p in positions]
    blob = ext_blob(positions, ext, k, v)
    with pytest.raises(StateFormatError, match="did not announce"):
        parse_state(blob)  # without cell_ext the extensions read as garbage
    state = parse_state(blob, cell_ext=True)
    assert state.layout.cell_ext and state.ext is not None and state.ext.tolist() == ext
    assert serialize_state(state, seq_id=1).tobytes() == blob
    blocks = split_blocks(state, block_tokens=2)
    assert blocks[1].ext is not None and blocks[1].ext.tolist() == ext[2:]
    assert build_state(state.layout, blocks[1:], seq_id=1).tobytes() == ext_blob(
        positions[2:], ext[2:], [layer[2:] for layer in k], [layer[2:] for layer in v]
    )
    blocks[0].ext = None
    with pytest.raises(StateFormatError, match="cell extensions the blocks do not carry"):
        build_state(state.layout, blocks, seq_id=1)


@pytest.mark.parametrize("v_trans", [False, True])
def test_serialize_state_is_bit_exact(v_trans):
    positions, k, v = sample(5, [4, 0, 1, 7, 5])
    blob = reference_blob(positions, k, v, v_trans)
    assert serialize_state(parse_state(blob), seq_id=1).tobytes() == blob
    empty = struct.pack("<IiII", STATE_MAGIC, 3, 1, 0)
    assert serialize_state(parse_state(empty), seq_id=3).tobytes() == empty
