"""Exact block scores (the fidelity oracle) against a plain-Python causal softmax."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvmem.errors import MemoryLayoutError
from kvmem.memory.exact_scorer import exact_block_scores, layer_block_mass, rerank_scores
from kvmem.memory.ggml_types import GgmlType
from kvmem.memory.host_store import BlockKV, HostStore
from kvmem.memory.retrieval_index import KeyGeometry
from kvmem.memory.rope import RopeParams, RopeType
from kvmem.memory.scorer import QueryVectors

BT = 4  # tokens per block


def reference_mass(q, q_pos, keys, k_pos, owners, n_blocks) -> list[float]:
    """Plain loops: per query row and head, softmax over the visible keys, summed per block."""
    n_rows, n_head, head_dim = q.shape
    group = n_head // keys[0].shape[0]
    mass = [0.0] * n_blocks
    for t in range(n_rows):
        for h in range(n_head):
            logits = [
                (sum(float(q[t, h, d]) * float(k[h // group, d]) for d in range(head_dim)), b)
                for k, p, b in zip(keys, k_pos, owners, strict=True)
                if p <= q_pos[t]
            ]
            top = max(v for v, _ in logits)
            w = [(math.exp((v - top) / math.sqrt(head_dim)), b) for v, b in logits]
            z = sum(x for x, _ in w)
            for x, b in w:
                mass[b] += x / z
    return [m / (n_rows * n_head) for m in mass]


def test_layer_block_mass_matches_reference() -> None:
    rng = np.random.default_rng(4)
    q = rng.standard_normal((3, 4, 8)).astype(np.float32)  # [n_rows, n_head, head_dim]
    k = rng.standard_normal((12, 2, 8)).astype(np.float32)  # [n_keys, n_kv, head_dim]
    k_pos = np.arange(12, dtype=np.int64)
    q_pos = np.array([5, 9, 20], dtype=np.int64)  # the first row sees keys 0..5 only
    owners = k_pos // BT
    got = layer_block_mass(q, q_pos, k, k_pos, owners, 3)
    want = reference_mass(q, q_pos.tolist(), list(k), k_pos.tolist(), owners.tolist(), 3)
    assert np.allclose(got, want, atol=1e-6)
    assert abs(float(got.sum()) - 1.0) < 1e-6


def _geometry(n_kv: int, hd: int) -> KeyGeometry:
    return KeyGeometry(
        n_layer=2,
        n_head_kv=n_kv,
        head_dim=hd,
        k_type=GgmlType.F16,
        rope=RopeParams(RopeType.NORM, hd),
        k_rotation=0,
    )


def _store(raw: list[np.ndarray]) -> HostStore:
    store = HostStore()
    for b in range(raw[0].shape[0] // BT):
        rows = slice(b * BT, (b + 1) * BT)
        k = [layer[rows].astype(np.float16).view(np.uint8).reshape(BT, -1) for layer in raw]
        v = [np.zeros((BT, 2), dtype=np.uint8) for _ in raw]
        pos = np.arange(b * BT, (b + 1) * BT, dtype=np.int32)
        store.put(BlockKV(block_id=b, positions=pos, k=k, v=v))
    return store


def test_exact_block_scores_average_layers_and_keep_candidate_order() -> None:
    rng = np.random.default_rng(5)
    n_kv, hd, n_head = 2, 4, 4
    raw = [rng.standard_normal((20, n_kv * hd)).astype(np.float32) for _ in range(2)]  # 5 blocks
    store = _store(raw)
    positions = np.array([20, 21], dtype=np.int64)
    q = {layer: rng.standard_normal((2, n_head, hd)).astype(np.float32) for layer in (0, 1)}
    query = QueryVectors(positions=positions, by_layer=q)
    got = exact_block_scores(store, _geometry(n_kv, hd), [3, 1, 2], query)
    per_layer = []
    for layer in (0, 1):
        keys = [r.reshape(n_kv, hd) for r in raw[layer].astype(np.float16).astype(np.float32)]
        owners = [p // BT for p in range(20)]
        per_layer.append(
            reference_mass(q[layer], positions.tolist(), keys, list(range(20)), owners, 5)
        )
    want = [(per_layer[0][b] + per_layer[1][b]) / 2 for b in (3, 1, 2)]
    assert got.dtype == np.float32 and got.shape == (3,)
    assert np.allclose(got, want, atol=1e-6)
    everything = exact_block_scores(store, _geometry(n_kv, hd), [0, 1, 2, 3, 4], query)
    assert abs(float(everything.sum()) - 1.0) < 1e-5


def test_exact_block_scores_rank_the_block_holding_the_matching_key_first() -> None:
    n_kv, hd = 1, 8
    raw = [np.zeros((16, hd), dtype=np.float32) for _ in range(2)]  # 4 blocks of zero keys
    raw[0][9] = raw[1][9] = 4.0  # one key in block 2 points along the query
    store = _store(raw)
    q = {layer: np.full((1, 2, hd), 1.0, dtype=np.float32) for layer in (0, 1)}
    query = QueryVectors(positions=np.array([16], dtype=np.int64), by_layer=q)
    got = exact_block_scores(store, _geometry(n_kv, hd), [0, 1, 2, 3], query)
    assert int(np.argmax(got)) == 2
    assert exact_block_scores(store, _geometry(n_kv, hd), [], query).shape == (0,)


def test_exact_block_scores_reject_unstored_candidates_and_empty_queries() -> None:
    store = _store([np.zeros((8, 8), dtype=np.float32)] * 2)
    geometry = _geometry(1, 8)
    q = QueryVectors(
        positions=np.array([8], dtype=np.int64),
        by_layer={0: np.ones((1, 1, 8), dtype=np.float32)},
    )
    with pytest.raises(MemoryLayoutError, match=r"\[5\] are not stored"):
        exact_block_scores(store, geometry, [0, 5], q)
    with pytest.raises(MemoryLayoutError, match="no captured layers"):
        exact_block_scores(store, geometry, [0], QueryVectors(positions=q.positions))


def test_rerank_reorders_the_summary_shortlist_by_exact_mass() -> None:
    n_kv, hd = 1, 8
    raw = [np.zeros((20, hd), dtype=np.float32) for _ in range(2)]  # 5 blocks of zero keys
    raw[0][13] = raw[1][13] = 4.0  # the matching key is in block 3
    raw[0][5] = raw[1][5] = 2.0  # a weaker one in block 1
    store = _store(raw)
    q = {layer: np.full((1, 2, hd), 1.0, dtype=np.float32) for layer in (0, 1)}
    query = QueryVectors(positions=np.array([20], dtype=np.int64), by_layer=q)
    candidates = [0, 1, 2, 3]  # block 4 is pinned (in the window anyway)
    summary = np.array([0.4, 0.1, 0.3, 0.15], dtype=np.float32)
    geometry = _geometry(n_kv, hd)
    got = rerank_scores(store, geometry, candidates, summary, query, shortlist=3, pinned=(4,))
    # shortlist by summary: 0, 2, 3; their exact mass is normalized over them and block 4
    exact = exact_block_scores(store, geometry, [0, 2, 3], query, among=[0, 2, 3, 4])
    assert np.allclose(got[[0, 2, 3]], 1.0 + exact, atol=1e-6)
    assert got[1] == np.float32(0.1)  # kept, below the shortlist
    order = sorted(candidates, key=lambda b: (-float(got[b]), -b))
    assert order == [3, 2, 0, 1]  # blocks 0 and 2 tie on exact mass: the newer first
    pinned_mass = exact_block_scores(store, geometry, [4], query, among=[0, 2, 3, 4])
    assert abs(float(exact.sum()) + float(pinned_mass[0]) - 1.0) < 1e-5
    everything = exact_block_scores(store, geometry, [0, 2, 3], query)  # block 1 takes a share
    assert float(everything[2]) < float(exact[2])
    same = rerank_scores(
        store, _geometry(n_kv, hd), candidates, summary, query, shortlist=0, pinned=(4,)
    )
    assert np.array_equal(same, summary)
