"""RetrievalIndex: content-frame block means against a plain loop, and bookkeeping."""

from __future__ import annotations

import math
import struct

import gguf
import numpy as np
import pytest

from kvmem.errors import MemoryLayoutError
from kvmem.memory.ggml_types import GgmlType
from kvmem.memory.retrieval_index import (
    SLICE_TOKENS,
    BlockKeys,
    KeyGeometry,
    RetrievalIndex,
    default_score_layers,
)
from kvmem.memory.rope import RopeParams, RopeType, apply_rope, undo_hadamard

N_LAYER, N_HEAD_KV, HEAD_DIM = 3, 2, 64
SCORED = (0, 2)


def _geometry(
    k_type: GgmlType, rope_type: RopeType, k_rotation: int, n_rot: int = 48
) -> KeyGeometry:
    rope = RopeParams(rope_type, n_rot=n_rot, freq_base=10000.0, freq_scale=1.0)
    return KeyGeometry(N_LAYER, N_HEAD_KV, HEAD_DIM, k_type, rope, k_rotation)


def _cache_rows(content: np.ndarray, positions: np.ndarray, g: KeyGeometry) -> list[np.ndarray]:
    """What llama.cpp stores: RoPE(k), Hadamard-rotated when k_rotation, in the cache type.

    content float32 [n_layer, n_tokens, n_head_kv, head_dim]; returns per layer uint8 rows.
    """
    rows = []
    for layer_keys in content:
        roped = apply_rope(layer_keys, positions, g.rope)  # [n_tokens, n_head_kv, head_dim]
        if g.k_rotation:
            roped = undo_hadamard(roped, g.k_rotation)  # H is its own inverse
        flat = roped.reshape(len(positions), g.n_embd_k)  # [n_tokens, n_embd_k]
        if g.k_type is GgmlType.F16:
            rows.append(flat.astype(np.float16).view(np.uint8))
        else:
            rows.append(gguf.quants.quantize(flat, gguf.GGMLQuantizationType(int(g.k_type))))
    return rows


def _decode_row_loop(raw: bytes, k_type: GgmlType) -> list[float]:
    if k_type is GgmlType.F16:
        return [struct.unpack("<e", raw[i : i + 2])[0] for i in range(0, len(raw), 2)]
    assert k_type is GgmlType.Q8_0
    out: list[float] = []
    for start in range(0, len(raw), 34):
        d = struct.unpack("<e", raw[start : start + 2])[0]
        out.extend(d * q for q in struct.unpack("<32b", raw[start + 2 : start + 34]))
    return out


def _mean_loop(
    rows: list[np.ndarray], positions: np.ndarray, g: KeyGeometry, layers: tuple[int, ...]
) -> np.ndarray:
    """Plain-Python block mean: decode, undo Hadamard, remove RoPE, average."""
    n_tokens = len(positions)
    sums = np.zeros((len(layers), g.n_head_kv, g.head_dim), dtype=np.float64)
    h = None
    if g.k_rotation:
        n = g.k_rotation
        h = [[(-1) ** bin(i & j).count("1") / math.sqrt(n) for j in range(n)] for i in range(n)]
    half = g.rope.n_rot // 2
    for li, layer in enumerate(layers):
        for t in range(n_tokens):
            values = _decode_row_loop(rows[layer][t].tobytes(), g.k_type)
            for head in range(g.n_head_kv):
                vec = values[head * g.head_dim : (head + 1) * g.head_dim]
                if h is not None:
                    n = g.k_rotation
                    vec = [
                        sum(h[i][j] * vec[c * n + j] for j in range(n))
                        for c in range(g.head_dim // n)
                        for i in range(n)
                    ]
                vec = list(vec)
                for i in range(half):
                    theta = -int(positions[t]) * g.rope.freq_base ** (-2.0 * i / g.rope.n_rot)
                    a, b = (
                        (2 * i, 2 * i + 1) if g.rope.rope_type is RopeType.NORM else (i, i + half)
                    )
                    x0, x1 = vec[a], vec[b]
                    vec[a] = x0 * math.cos(theta) - x1 * math.sin(theta)
                    vec[b] = x0 * math.sin(theta) + x1 * math.cos(theta)
                for d in range(g.head_dim):
                    sums[li, head, d] += vec[d]
    return sums / n_tokens


@pytest.mark.parametrize("k_type", [GgmlType.F16, GgmlType.Q8_0])
@pytest.mark.parametrize("rope_type", [RopeType.NORM, RopeType.NEOX])
@pytest.mark.parametrize("k_rotation", [0, 64])
def test_block_mean_matches_loop(k_type: GgmlType, rope_type: RopeType, k_rotation: int) -> None:
    g = _geometry(k_type, rope_type, k_rotation)
    rng = np.random.default_rng(int(k_type) * 10 + k_rotation)
    positions = np.array([128, 129, 131, 140, 200, 255], dtype=np.int32)  # [n_tokens], gaps allowed
    content = rng.standard_normal((N_LAYER, 6, N_HEAD_KV, HEAD_DIM)).astype(np.float32)
    rows = _cache_rows(content, positions, g)
    index = RetrievalIndex(g, SCORED)
    index.add(1, positions, rows)
    got = index.means([1])
    assert got.dtype == np.float32
    assert got.shape == (1, len(SCORED), N_HEAD_KV, HEAD_DIM)
    np.testing.assert_allclose(got[0], _mean_loop(rows, positions, g, SCORED), rtol=0, atol=2e-5)
    # and the pipeline recovers the content-frame mean that went in, up to the cache's precision
    tolerance = 5e-3 if k_type is GgmlType.F16 else 3e-2
    np.testing.assert_allclose(got[0], content[list(SCORED)].mean(axis=1), rtol=0, atol=tolerance)
    lo, hi = index.bounds([1])  # per-channel min / max of the content-frame keys
    np.testing.assert_allclose(lo[0], content[list(SCORED)].min(axis=1), rtol=0, atol=tolerance)
    np.testing.assert_allclose(hi[0], content[list(SCORED)].max(axis=1), rtol=0, atol=tolerance)


def _small_index() -> tuple[RetrievalIndex, KeyGeometry]:
    g = KeyGeometry(2, 1, 4, GgmlType.F32, RopeParams(RopeType.NORM, n_rot=4), 0)
    return RetrievalIndex(g, [1]), g


def _const_block(g: KeyGeometry, value: float, n_tokens: int = 2) -> list[np.ndarray]:
    """K rows whose content (at position 0) is `value` everywhere; float32 rows as bytes."""
    rows = np.full((n_tokens, g.n_embd_k), value, dtype=np.float32)  # [n_tokens, n_embd_k]
    return [rows.view(np.uint8).copy() for _ in range(g.n_layer)]


def test_add_remove_grow_and_order() -> None:
    index, g = _small_index()
    zeros = np.zeros(2, dtype=np.int32)  # [n_tokens] position 0: RoPE is the identity
    for b in range(100):
        index.add(b, zeros, _const_block(g, float(b)))
    assert len(index) == 100
    index.remove([3, 50, 99, 500])
    assert len(index) == 97
    assert 3 not in index and 4 in index
    assert index.block_ids() == tuple(b for b in range(100) if b not in (3, 50, 99))
    got = index.means([98, 0, 4, 97])
    assert got.shape == (4, 1, 1, 4)
    assert got[:, 0, 0, 0].tolist() == [98.0, 0.0, 4.0, 97.0]
    index.add(4, zeros, _const_block(g, -1.0))  # replaces
    assert len(index) == 97
    assert index.means([4])[0, 0, 0].tolist() == [-1.0] * 4
    assert index.nbytes == 128 * 3 * 1 * 1 * 4 * 4  # capacity doubled to 128 rows of 3 stats


def test_means_is_a_copy() -> None:
    index, g = _small_index()
    index.add(0, np.zeros(2, dtype=np.int32), _const_block(g, 2.0))
    got = index.means([0])
    got[...] = 0.0
    assert index.means([0])[0, 0, 0, 0] == 2.0


def test_invalid_arguments() -> None:
    index, g = _small_index()
    with pytest.raises(MemoryLayoutError):
        index.means([0])
    with pytest.raises(MemoryLayoutError):
        index.add(0, np.zeros(2, dtype=np.int32), _const_block(g, 1.0)[:1])  # one layer missing
    with pytest.raises(MemoryLayoutError):
        index.add(0, np.zeros(3, dtype=np.int32), _const_block(g, 1.0))  # 3 positions, 2 rows
    with pytest.raises(MemoryLayoutError):
        index.add(0, np.zeros(0, dtype=np.int32), _const_block(g, 1.0, n_tokens=0))
    with pytest.raises(MemoryLayoutError):
        RetrievalIndex(g, [2])
    with pytest.raises(MemoryLayoutError):
        RetrievalIndex(g, [])
    with pytest.raises(MemoryLayoutError):
        KeyGeometry(2, 1, 96, GgmlType.Q8_0, RopeParams(RopeType.NORM, n_rot=64), 64)
    assert len(index) == 0


@pytest.mark.parametrize("k_type", [GgmlType.F16, GgmlType.Q8_0])
def test_add_blocks_batched_equals_one_by_one(k_type: GgmlType) -> None:
    g = _geometry(k_type, RopeType.NEOX, 64 if k_type is GgmlType.Q8_0 else 0)
    rng = np.random.default_rng(3)
    blocks = []
    for block_id, n_tokens in ((4, 6), (5, 6), (9, 6), (11, 3)):  # the last is shorter
        positions = np.arange(block_id * 8, block_id * 8 + n_tokens, dtype=np.int32)
        content = rng.standard_normal((N_LAYER, n_tokens, N_HEAD_KV, HEAD_DIM)).astype(np.float32)
        blocks.append(BlockKeys(block_id, positions, _cache_rows(content, positions, g)))
    one_by_one = RetrievalIndex(g, SCORED)
    for b in blocks:
        one_by_one.add(b.block_id, b.positions, b.k_rows)
    batched = RetrievalIndex(g, SCORED)
    batched.add_blocks(blocks[:3])  # equal lengths: one vectorized pass
    batched.add_blocks(blocks[3:])
    assert batched.block_ids() == (4, 5, 9, 11)
    ids = [4, 5, 9, 11]
    np.testing.assert_allclose(batched.means(ids), one_by_one.means(ids), rtol=0, atol=1e-6)
    summaries = batched.summarize(blocks)  # mixed lengths: per-block fallback
    # [n_blocks, (mean, min, max), n_scored, n_kv, head_dim]
    np.testing.assert_allclose(summaries[:, 0], one_by_one.means(ids), rtol=0, atol=1e-6)
    for got, want in zip(batched.bounds(ids), one_by_one.bounds(ids), strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    with pytest.raises(MemoryLayoutError):
        batched.put([1], summaries)  # 4 summaries for 1 id


def test_a_batch_past_the_slice_is_summarized_in_slices_with_the_same_values() -> None:
    """Five 64-token blocks are three slices of at most SLICE_TOKENS tokens (2, 2, 1
    blocks): each block's (mean, min, max) is bit for bit its summary alone."""
    g = _geometry(GgmlType.Q8_0, RopeType.NEOX, 64)
    rng = np.random.default_rng(5)
    n_tokens = 64
    assert SLICE_TOKENS // n_tokens == 2
    blocks = []
    for block_id in (2, 3, 7, 8, 12):
        positions = np.arange(block_id * n_tokens, (block_id + 1) * n_tokens, dtype=np.int32)
        content = rng.standard_normal((N_LAYER, n_tokens, N_HEAD_KV, HEAD_DIM)).astype(np.float32)
        blocks.append(BlockKeys(block_id, positions, _cache_rows(content, positions, g)))
    index = RetrievalIndex(g, SCORED)
    batch = index.summarize(blocks)  # [5, 3, n_scored, n_kv, head_dim]
    alone = np.stack([index.summarize([b])[0] for b in blocks])  # the same, block by block
    assert batch.shape == (5, 3, len(SCORED), N_HEAD_KV, HEAD_DIM)
    assert batch.dtype == np.float32
    np.testing.assert_array_equal(batch, alone)
    index.add_blocks(blocks)
    assert index.block_ids() == (2, 3, 7, 8, 12)
    np.testing.assert_array_equal(index.means([7, 12]), batch[[2, 4], 0])


def test_default_score_layers() -> None:
    assert default_score_layers(24) == tuple(range(1, 24))
    assert default_score_layers(30) == (1, 2, 4, 5, 6, 7, 9, 10, 11, 12, 14, 15) + (
        16,
        18,
        19,
        20,
        21,
        23,
        24,
        25,
        26,
        28,
        29,
    )
    assert default_score_layers(36, count=8) == (1, 6, 11, 16, 20, 25, 30, 35)
    assert default_score_layers(9) == tuple(range(1, 9))
    assert default_score_layers(2) == (1,)
    assert default_score_layers(1) == (0,)
