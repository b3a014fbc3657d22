"""The seq-state codec on real hybrid blobs from llama.cpp (tiny synthetic qwen35): full
blobs (attention part + recurrent part) and PARTIAL_ONLY blobs parse and re-serialize
bit-exactly, llama.cpp accepts the re-serialized blob, and broken blobs are refused."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from kvmem.engine.hybrid.hybrid_codec import (
    parse_hybrid_state,
    parse_partial_state,
    serialize_hybrid_state,
    serialize_partial_state,
)
from kvmem.engine.hybrid.recurrent_state import PARTIAL_ONLY
from kvmem.engine.llama.context import ContextSettings, LlamaContext
from kvmem.engine.llama.model import LlamaModel
from kvmem.engine.transfer.state_codec import parse_state
from kvmem.errors import StateFormatError
from kvmem.memory.ggml_types import GgmlType

from .hybrid_models import tiny_hybrid_path  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow

TOKENS = [1, 50, 60, 70, 80, 90, 100, 110]
R_ROW = (4 - 1) * (2 * 64 + 128) * 4  # (d_conv - 1) x conv_dim f32
S_ROW = 32 * 32 * 4 * 4  # head_v_dim^2 x value heads f32


@pytest.fixture(scope="module")
def model(tiny_hybrid_path: Path) -> Iterator[LlamaModel]:  # noqa: F811
    m = LlamaModel(str(tiny_hybrid_path))
    yield m
    m.close()


@pytest.fixture(scope="module", params=[True, False], ids=["flash", "v_trans"])
def ctx(request: pytest.FixtureRequest, model: LlamaModel) -> Iterator[LlamaContext]:
    c = LlamaContext(model, ContextSettings(n_cells=256, n_threads=1, flash_attn=request.param))
    c.decode(TOKENS, 0, [False] * (len(TOKENS) - 1) + [True])
    yield c
    c.close()


def test_full_blob_parses_and_reserializes_bit_exact(ctx: LlamaContext) -> None:
    blob = bytes(ctx.get_state(0))
    state = parse_hybrid_state(blob, cell_ext=True)
    assert state.seq_id == 0
    attn = state.attn
    assert attn.positions.tolist() == list(range(8))
    assert attn.layout.cell_ext and attn.layout.v_trans is not ctx.settings.flash_attn
    assert len(attn.layout.layers) == 2  # layers 1 and 3
    assert attn.layout.layers[0].k_type == GgmlType.F16
    assert attn.layout.layers[0].k_row_bytes == 2 * 32 * 2  # 2 KV heads x 32 x f16
    # llama_kv_cell_ext of a text token: x = y = pos, tok = the token id
    assert attn.ext is not None
    assert attn.ext.tolist() == [[p, p, t] for p, t in enumerate(TOKENS)]
    rec = state.recurrent
    assert rec.layout.n_layer == 4 and rec.layout.n_recurrent == 2
    assert rec.layout.r == ((GgmlType.F32, R_ROW),) * 2
    assert rec.layout.s == ((GgmlType.F32, S_ROW),) * 2
    assert rec.positions.tolist() == [7]
    assert serialize_hybrid_state(state).tobytes() == blob


def test_partial_blob_is_the_recurrent_part(ctx: LlamaContext) -> None:
    blob = bytes(ctx.get_state(0))
    partial = bytes(ctx.get_state(0, PARTIAL_ONLY))
    full = parse_hybrid_state(blob, cell_ext=True)
    state = parse_partial_state(partial, expect=full.recurrent.layout)
    assert state.seq_id == 0 and state.recurrent.same_as(full.recurrent)
    assert blob.endswith(partial[8:])  # the same bytes after the attention part
    assert serialize_partial_state(state).tobytes() == partial
    assert len(partial) == 8 + 4 + 8 + 8 + 2 * (12 + R_ROW) + 2 * (12 + S_ROW)


def test_reserialized_blob_restores_in_llama_cpp(ctx: LlamaContext) -> None:
    source = parse_hybrid_state(bytes(ctx.get_state(0)), cell_ext=True)
    copy = parse_hybrid_state(serialize_hybrid_state(source).tobytes(), cell_ext=True)
    ctx.set_state(serialize_hybrid_state(copy), 2)
    try:
        back = parse_hybrid_state(bytes(ctx.get_state(2)), cell_ext=True)
        assert back.seq_id == 2
        assert back.attn.positions.tolist() == source.attn.positions.tolist()
        for a, b in zip(back.attn.k + back.attn.v, source.attn.k + source.attn.v, strict=True):
            assert np.array_equal(a, b)
        assert back.recurrent.same_as(source.recurrent)
    finally:
        ctx.seq_rm(2, -1, -1)
    empty = parse_hybrid_state(bytes(ctx.get_state(2)), cell_ext=True)
    assert empty.attn.positions.size == 0 and empty.recurrent.positions.size == 0
    assert empty.recurrent.layout.n_recurrent == 2  # headers without rows


def test_unknown_or_broken_blobs_are_refused(ctx: LlamaContext) -> None:
    blob = bytes(ctx.get_state(0))
    partial = bytes(ctx.get_state(0, PARTIAL_ONLY))
    with pytest.raises(StateFormatError, match="unexpected bytes after the KV data"):
        parse_state(blob, cell_ext=True)
    with pytest.raises(StateFormatError, match="cell extensions the model did not announce"):
        parse_hybrid_state(blob, cell_ext=False)
    with pytest.raises(StateFormatError, match="ends early"):
        parse_hybrid_state(blob[:-3], cell_ext=True)
    with pytest.raises(StateFormatError, match="ends early"):
        parse_partial_state(partial[:-1])
    # the last S tensor cut off at its boundary: 3 tensors cannot be R + S pairs
    with pytest.raises(StateFormatError, match="3 recurrent tensors for 4 layers"):
        parse_partial_state(partial[: -(12 + S_ROW)])
    # ... and without R1 and S1: one recurrent layer, where the attention part leaves two
    cut = blob[: -(2 * (12 + S_ROW) + 12 + R_ROW)] + blob[-(2 * (12 + S_ROW)) : -(12 + S_ROW)]
    with pytest.raises(StateFormatError, match="1 recurrent layers, but 4 layers minus 2"):
        parse_hybrid_state(cut, cell_ext=True)
    with pytest.raises(StateFormatError, match="s_trans = 1 .* an attention part"):
        parse_partial_state(blob)  # a full blob is not a recurrent part
    bad_type = bytearray(partial)
    struct.pack_into("<i", bad_type, 8 + 4 + 8 + 8, 77)  # the first R tensor's type
    with pytest.raises(StateFormatError, match="state type 77 is not supported"):
        parse_partial_state(bytes(bad_type))
    with pytest.raises(StateFormatError, match="magic"):
        parse_partial_state(b"\0\0\0\0" + partial[4:])
    other = parse_partial_state(partial).recurrent.layout
    other = type(other)(n_layer=other.n_layer, r=other.r[:1], s=other.s[:1])
    with pytest.raises(StateFormatError, match="is not the expected"):
        parse_partial_state(partial, expect=other)
