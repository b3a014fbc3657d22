"""The native gather/scatter (engine/transfer/kv_copy.py, native/kv_copy.c) writes the bytes of the
numpy path (state_codec + owned_block, the reference), for f16, q8_0 and q4_0 rows, V
transposed and not, cells out of order, on one thread and several (no model)."""

from __future__ import annotations

import numpy as np
import pytest

from kvmem.engine.transfer.harvest_split import owned_block, split_owned
from kvmem.engine.transfer.kv_copy import native_copy
from kvmem.engine.transfer.state_codec import (
    LayerLayout,
    StateLayout,
    build_state,
    parse_state,
    split_blocks,
)
from kvmem.memory.ggml_types import GgmlType
from kvmem.memory.host_store import BlockKV

N_EMBD = 64  # K and V elements per cell and layer
ROW_BYTES = {
    GgmlType.F16: N_EMBD * 2,
    GgmlType.Q8_0: N_EMBD // 32 * 34,
    GgmlType.Q4_0: N_EMBD // 32 * 18,
}
BT = 32  # block tokens


@pytest.fixture(scope="module")
def native():
    lib = native_copy(threads=1)
    if lib is None:
        pytest.skip("no C compiler: the native copy cannot be built")
    return lib


def layout_for(kv: GgmlType, v_trans: bool, cell_ext: bool = False) -> StateLayout:
    """Three layers of `kv` rows; transposed V is f16 (llama.cpp transposes only
    unquantized V)."""
    v_type = GgmlType.F16 if v_trans else kv
    layer = LayerLayout(kv, ROW_BYTES[kv], v_type, ROW_BYTES[v_type], 2 if v_trans else 0)
    return StateLayout(v_trans, (layer,) * 3, cell_ext)


def random_blocks(layout: StateLayout, ids: list[int], lengths: list[int], seed: int):
    rng = np.random.default_rng(seed)
    blocks = []
    for b, n in zip(ids, lengths, strict=True):
        k = [rng.integers(0, 256, (n, lay.k_row_bytes), dtype=np.uint8) for lay in layout.layers]
        v = [rng.integers(0, 256, (n, lay.v_row_bytes), dtype=np.uint8) for lay in layout.layers]
        ext = rng.integers(-9, 9, (n, 3), dtype=np.int32) if layout.cell_ext else None
        blocks.append(BlockKV(b, np.arange(b * BT, b * BT + n, dtype=np.int32), k, v, ext))
    return blocks


CASES = [(kv, vt) for kv in (GgmlType.F16, GgmlType.Q8_0, GgmlType.Q4_0) for vt in (False, True)]


@pytest.mark.parametrize(("kv", "v_trans"), CASES)
@pytest.mark.parametrize("threads", [1, 5])  # 5: bytes not divisible by it
def test_restore_blob_is_the_numpy_blob(native, kv, v_trans, threads):
    layout = layout_for(kv, v_trans)
    blocks = random_blocks(layout, [0, 2, 3, 7], [BT, BT, BT, 5], seed=1)
    # a source that is not contiguous (every other row of a larger array) is copied first
    wide = np.repeat(blocks[1].k[1], 2, axis=0)  # [2 * BT, row]
    blocks[1].k[1] = wide[::2]
    assert not blocks[1].k[1].flags.c_contiguous
    reference = build_state(layout, blocks, seq_id=2)
    out = np.full(len(reference), 0xEE, dtype=np.uint8)  # [n_bytes], dirty: all overwritten
    native.threads = threads
    got = build_state(layout, blocks, seq_id=2, out=out, native=native)
    assert got is out
    assert np.array_equal(got, reference)


def shuffled_blob(layout: StateLayout, seed: int) -> tuple[np.ndarray, list[BlockKV]]:
    """A blob whose cells are out of position order (runs of consecutive blob cells
    inside blocks, and blocks interleaved), and the blocks it holds."""
    blocks = random_blocks(layout, [0, 1, 4, 5], [BT, BT, BT, 7], seed)
    cells = BlockKV(
        -1,
        np.concatenate([b.positions for b in blocks]),
        [np.concatenate([b.k[i] for b in blocks]) for i in range(3)],
        [np.concatenate([b.v[i] for b in blocks]) for i in range(3)],
        np.concatenate([b.ext for b in blocks]) if layout.cell_ext else None,
    )
    n = len(cells.positions)
    order = np.r_[np.arange(40, 60), np.arange(0, 10), np.arange(60, n), np.arange(10, 40)]
    order[[3, 4]] = order[[4, 3]]  # two cells swapped inside a run
    shuffled = BlockKV(
        -1,
        cells.positions[order],
        [k[order] for k in cells.k],
        [v[order] for v in cells.v],
        None if cells.ext is None else cells.ext[order],
    )
    return build_state(layout, [shuffled], seq_id=1), blocks


@pytest.mark.parametrize(("kv", "v_trans"), CASES)
@pytest.mark.parametrize("threads", [1, 7])
@pytest.mark.parametrize("cell_ext", [False, True])
def test_harvest_split_is_the_numpy_split(native, kv, v_trans, threads, cell_ext):
    layout = layout_for(kv, v_trans, cell_ext)
    blob, expected = shuffled_blob(layout, seed=2)
    reference = [owned_block(b) for b in split_blocks(parse_state(blob, cell_ext=cell_ext), BT)]
    state = parse_state(blob, cell_ext=cell_ext, transpose_v=False)
    assert (state.v_cols is not None) is v_trans
    native.threads = threads
    plan = native.plan()
    taken: list[np.ndarray] = []

    def take(n_bytes: int) -> np.ndarray:
        taken.append(np.full(n_bytes, 0xEE, dtype=np.uint8))  # [n_bytes], dirty
        return taken[-1]

    got = split_owned(state, BT, take, plan)
    assert plan.bytes == sum(a.nbytes for b in got for a in [*b.k, *b.v])
    plan.run()
    assert [b.block_id for b in got] == [b.block_id for b in reference] == [0, 1, 4, 5]
    for g, r, e in zip(got, reference, expected, strict=True):
        assert np.array_equal(g.positions, r.positions) and g.positions.dtype == np.int32
        assert all(np.array_equal(x, y) for x, y in zip(g.k, r.k, strict=True))
        assert all(np.array_equal(x, y) for x, y in zip(g.v, r.v, strict=True))
        assert all(np.array_equal(x, y) for x, y in zip(g.v, e.v, strict=True))
        assert (g.ext is None) is not cell_ext
        assert g.ext is None or np.array_equal(g.ext, r.ext)
    # each block owns one buffer: all layers' K rows, then V rows
    for g, buf in zip(got, taken, strict=True):
        assert np.array_equal(np.concatenate([a.ravel() for a in [*g.k, *g.v]]), buf)
        assert all(a.base is buf for a in [*g.k, *g.v])


def test_native_copy_off(monkeypatch):
    monkeypatch.setenv("KVMEM_NATIVE_COPY", "0")
    assert native_copy(threads=2) is None
