"""Attention-mass coverage of the selected window, from captured queries and stored keys.

For every scored layer the query tokens (post-RoPE, as llama.cpp computed them) attend
with an exact softmax over the keys of every history block in the host store (post-RoPE
keys as the cache holds them, dequantized and with a quantized cache's Hadamard rotation
undone), causally (keys at positions <= the query token's). Coverage is the share of
that mass on blocks the window holds: the plan's selected blocks plus the blocks after
them (the pinned query block, the open tail and blocks completed later), averaged over
query tokens, query heads and layers. Tokens of the open tail block are not in the store
and so are left out of both the numerator and the denominator.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from kvmem.memory.exact_scorer import stored_layer_keys
from kvmem.memory.host_store import HostStore
from kvmem.memory.planner import WindowPlan
from kvmem.memory.retrieval_index import KeyGeometry
from kvmem.memory.scorer import QueryVectors

_TOKEN_CHUNK = 64


@dataclass(slots=True)
class Coverage:
    mean: float  # averaged over layers
    by_layer: dict[int, float]
    n_keys: int  # history tokens the mass was computed over
    n_window_keys: int  # of those, tokens in window blocks


def window_blocks(plan: WindowPlan | None, block_ids: Iterable[int]) -> set[int]:
    """The stored blocks the window holds: selected, or after the last selected block."""
    ids = set(block_ids)
    if plan is None or not plan.selected:
        return ids
    last = max(plan.selected)
    return {b for b in ids if b in plan.selected or b > last}


def stored_keys(
    store: HostStore, geometry: KeyGeometry, layer: int, block_ids: list[int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Keys of `layer` for the blocks: float32 [n_keys, n_head_kv, head_dim], positions
    int64 [n_keys] and block ids int64 [n_keys] (memory.exact_scorer.stored_layer_keys)."""
    k, positions, owners = stored_layer_keys(store, geometry, layer, block_ids)
    return k, positions, np.asarray(block_ids, dtype=np.int64)[owners]  # [n_keys]


def layer_coverage(
    q: np.ndarray, q_pos: np.ndarray, k: np.ndarray, k_pos: np.ndarray, in_window: np.ndarray
) -> float:
    """Mean over query tokens and heads of the causal softmax mass on `in_window` keys.

    q float32 [n_tokens, n_head, head_dim]; k float32 [n_keys, n_head_kv, head_dim];
    in_window bool [n_keys]. Query head h uses KV head h // (n_head // n_head_kv).
    """
    n_tokens, n_head, head_dim = q.shape
    n_head_kv = k.shape[1]
    group = n_head // n_head_kv
    scale = 1.0 / math.sqrt(head_dim)
    kk = k.astype(np.float64)  # [n_keys, n_head_kv, head_dim]
    total = 0.0
    for t0 in range(0, n_tokens, _TOKEN_CHUNK):
        qq = q[t0 : t0 + _TOKEN_CHUNK].astype(np.float64)  # [n_chunk, n_head, head_dim]
        n_chunk = qq.shape[0]
        grouped = qq.reshape(
            n_chunk, n_head_kv, group, head_dim
        )  # [n_chunk, n_kv, group, head_dim]
        logits = np.einsum("tkgd,nkd->tkgn", grouped, kk) * scale  # [n_chunk, n_kv, group, n_keys]
        visible = k_pos[None, :] <= q_pos[t0 : t0 + n_chunk, None]  # [n_chunk, n_keys]
        assert bool(visible.any(axis=1).all()), "every query token sees at least one key"
        logits = np.where(visible[:, None, None, :], logits, -np.inf)
        logits -= logits.max(axis=-1, keepdims=True)
        weights = np.exp(logits)  # [n_chunk, n_kv, group, n_keys]
        weights /= weights.sum(axis=-1, keepdims=True)
        total += float(weights[..., in_window].sum())
    return total / (n_tokens * n_head)


def window_coverage(
    query: QueryVectors, store: HostStore, geometry: KeyGeometry, plan: WindowPlan | None
) -> Coverage | None:
    """Coverage for the layers the query has vectors for; None when nothing is stored
    before the query."""
    q_pos = np.asarray(query.positions, dtype=np.int64)  # [n_tokens]
    last = int(q_pos.max())
    block_ids = [b for b in store.block_ids() if int(store.get(b).positions[0]) <= last]
    if block_ids and int(store.get(block_ids[0]).positions[0]) > int(q_pos.min()):
        return None  # the first query token would see no stored key
    if not block_ids or not query.by_layer:
        return None
    window = window_blocks(plan, block_ids)
    by_layer: dict[int, float] = {}
    n_keys = n_window = 0
    for layer in sorted(query.by_layer):
        k, k_pos, owners = stored_keys(store, geometry, layer, block_ids)
        in_window = np.isin(owners, np.fromiter(window, dtype=np.int64))  # [n_keys]
        q = np.asarray(query.by_layer[layer], dtype=np.float32)  # [n_tokens, n_head, head_dim]
        by_layer[layer] = layer_coverage(q, q_pos, k, k_pos, in_window)
        n_keys, n_window = int(k.shape[0]), int(in_window.sum())
    return Coverage(
        mean=float(np.mean(list(by_layer.values()))),
        by_layer=by_layer,
        n_keys=n_keys,
        n_window_keys=n_window,
    )
