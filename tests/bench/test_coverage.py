"""Attention-mass coverage against a plain-Python softmax over every stored key."""

from __future__ import annotations

import math

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from kvmem.bench.coverage import layer_coverage, window_blocks, window_coverage
from kvmem.memory.ggml_types import GgmlType
from kvmem.memory.host_store import BlockKV, HostStore
from kvmem.memory.planner import Tier, WindowPlan
from kvmem.memory.retrieval_index import KeyGeometry
from kvmem.memory.rope import RopeParams, RopeType, hadamard_matrix
from kvmem.memory.scorer import QueryVectors

BT = 4  # tokens per block


def plan(selected: tuple[int, ...]) -> WindowPlan:
    return WindowPlan(
        selected=selected,
        tiers={Tier.SINK: selected[:1], Tier.RECENT: selected[-1:]},
        unpinned={},
        keep=selected,
        stage_in=(),
        evict=(),
    )


def test_window_blocks() -> None:
    assert window_blocks(None, [0, 1, 2]) == {0, 1, 2}
    assert window_blocks(plan((0, 3, 5)), range(8)) == {0, 3, 5, 6, 7}


def reference_coverage(
    q: np.ndarray,
    q_pos: list[int],
    keys: list[np.ndarray],
    k_pos: list[int],
    owners: list[int],
    window: set[int],
) -> float:
    """Plain loops: for each token and query head, softmax over visible keys."""
    n_tokens, n_head, head_dim = q.shape
    n_kv = keys[0].shape[0]
    group = n_head // n_kv
    total = 0.0
    for t in range(n_tokens):
        for h in range(n_head):
            kv = h // group
            logits = []
            for k, p, b in zip(keys, k_pos, owners, strict=True):
                if p <= q_pos[t]:
                    dot = sum(float(q[t, h, d]) * float(k[kv, d]) for d in range(head_dim))
                    logits.append((dot / math.sqrt(head_dim), b))
            top = max(v for v, _ in logits)
            weights = [(math.exp(v - top), b) for v, b in logits]
            z = sum(w for w, _ in weights)
            total += sum(w for w, b in weights if b in window) / z
    return total / (n_tokens * n_head)


def test_layer_coverage_matches_reference() -> None:
    rng = np.random.default_rng(1)
    q = rng.standard_normal((3, 4, 8)).astype(np.float32)  # [n_tokens, n_head, head_dim]
    k = rng.standard_normal((10, 2, 8)).astype(np.float32)  # [n_keys, n_kv, head_dim]
    k_pos = np.arange(10, dtype=np.int64)  # [n_keys]
    q_pos = np.array([7, 8, 12], dtype=np.int64)  # [n_tokens]: the first token sees keys 0..7
    owners = k_pos // BT
    in_window = np.isin(owners, [0, 2])
    got = layer_coverage(q, q_pos, k, k_pos, in_window)
    want = reference_coverage(q, q_pos.tolist(), list(k), k_pos.tolist(), owners.tolist(), {0, 2})
    assert abs(got - want) < 1e-9
    assert abs(layer_coverage(q, q_pos, k, k_pos, np.ones(10, dtype=bool)) - 1.0) < 1e-12


def _store(keys_by_layer: list[np.ndarray], k_type: GgmlType, n_embd_k: int) -> HostStore:
    """Blocks of BT tokens; keys_by_layer[layer] float32 [n_tokens, n_embd_k] as stored."""
    store = HostStore()
    n_tokens = keys_by_layer[0].shape[0]
    for b in range(n_tokens // BT):
        rows = slice(b * BT, (b + 1) * BT)
        k = []
        for layer_keys in keys_by_layer:
            chunk = layer_keys[rows]
            if k_type is GgmlType.F16:
                k.append(chunk.astype(np.float16).view(np.uint8).reshape(BT, -1))
            else:
                k.append(quantize(chunk, GGMLQuantizationType.Q8_0))
        v = [np.zeros((BT, 2), dtype=np.uint8) for _ in keys_by_layer]
        store.put(
            BlockKV(block_id=b, positions=np.arange(b * BT, (b + 1) * BT, dtype=np.int32), k=k, v=v)
        )
    return store


def test_window_coverage_f16_against_reference() -> None:
    rng = np.random.default_rng(2)
    n_kv, hd, n_head = 2, 4, 4
    raw = [rng.standard_normal((16, n_kv * hd)).astype(np.float32) for _ in range(2)]  # 4 blocks
    store = _store(raw, GgmlType.F16, n_kv * hd)
    geometry = KeyGeometry(
        n_layer=2,
        n_head_kv=n_kv,
        head_dim=hd,
        k_type=GgmlType.F16,
        rope=RopeParams(RopeType.NORM, hd),
        k_rotation=0,
    )
    positions = np.array([16, 17], dtype=np.int64)  # [n_tokens] after the 4 blocks
    q = {layer: rng.standard_normal((2, n_head, hd)).astype(np.float32) for layer in (0, 1)}
    cov = window_coverage(
        QueryVectors(positions=positions, by_layer=q), store, geometry, plan((0, 2))
    )
    assert cov is not None
    assert (
        cov.n_keys == 16 and cov.n_window_keys == 12
    )  # blocks 0, 2 and 3 (after the last selected)
    for layer in (0, 1):
        keys = [r.reshape(n_kv, hd) for r in raw[layer].astype(np.float16).astype(np.float32)]
        want = reference_coverage(
            q[layer],
            positions.tolist(),
            keys,
            list(range(16)),
            [p // BT for p in range(16)],
            {0, 2, 3},
        )
        assert abs(cov.by_layer[layer] - want) < 1e-6
    assert abs(cov.mean - (cov.by_layer[0] + cov.by_layer[1]) / 2) < 1e-12


def test_window_coverage_q8_0_undoes_the_hadamard_rotation() -> None:
    rng = np.random.default_rng(3)
    n_kv, hd, n_head = 2, 16, 2
    plain = rng.standard_normal((8, n_kv * hd)).astype(np.float32)  # post-RoPE keys, 2 blocks
    h = hadamard_matrix(16)
    rotated = (plain.reshape(8, n_kv, hd) @ h).reshape(8, n_kv * hd)  # what the cache stores
    store = _store([rotated], GgmlType.Q8_0, n_kv * hd)
    geometry = KeyGeometry(
        n_layer=1,
        n_head_kv=n_kv,
        head_dim=hd,
        k_type=GgmlType.Q8_0,
        rope=RopeParams(RopeType.NORM, hd),
        k_rotation=16,
    )
    positions = np.array([9], dtype=np.int64)
    q = rng.standard_normal((1, n_head, hd)).astype(np.float32)
    cov = window_coverage(
        QueryVectors(positions=positions, by_layer={0: q}), store, geometry, plan((1,))
    )
    stored = dequantize(quantize(rotated, GGMLQuantizationType.Q8_0), GGMLQuantizationType.Q8_0)
    keys = [(row.reshape(n_kv, hd) @ h) for row in stored]  # H is its own inverse
    want = reference_coverage(q, [9], keys, list(range(8)), [p // BT for p in range(8)], {1})
    assert cov is not None and abs(cov.mean - want) < 1e-5


def test_no_coverage_without_stored_history() -> None:
    geometry = KeyGeometry(
        n_layer=1,
        n_head_kv=1,
        head_dim=4,
        k_type=GgmlType.F16,
        rope=RopeParams(RopeType.NORM, 4),
        k_rotation=0,
    )
    query = QueryVectors(
        positions=np.array([3], dtype=np.int64), by_layer={0: np.zeros((1, 1, 4), dtype=np.float32)}
    )
    assert window_coverage(query, HostStore(), geometry, None) is None
