"""Exact block scores: the true causal attention mass of the query rows on each block.

The summary scorer (scorer.py) stands each block in with one vector (its mean key or the
bound of q.k over its keys). This one is the reference it approximates: for every scored
layer the captured query rows (post-RoPE) attend with an exact causal softmax over every
key of every stored block (post-RoPE as the cache holds them, dequantized, a quantized
cache's Hadamard rotation undone); a block's score is the share of that mass on its keys,
averaged over query rows, query heads and layers. It ranks the window by what the model
would attend to with the whole history in reach, and so separates ranking error from the
budget's own limit (the fidelity oracle, `--kvmem-rank exact`).

Cost: n_layers x n_rows x n_head x n_keys logits (every stored token, not one per block),
as batched float32 matmuls, one KV head group at a time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import Enum

import numpy as np

from kvmem.errors import MemoryLayoutError
from kvmem.memory.ggml_types import dequantize_rows
from kvmem.memory.host_store import BlockStore
from kvmem.memory.retrieval_index import KeyGeometry
from kvmem.memory.rope import undo_hadamard
from kvmem.memory.scorer import QueryVectors

_ROW_CHUNK = 128  # query rows whose logits are computed at once


class RankMode(Enum):
    """What ranks the retrieval candidates."""

    SUMMARY = "summary"  # the block summaries of the retrieval index (scorer.py): the default
    EXACT = "exact"  # the exact attention mass over the stored keys (this module)
    RERANK = "rerank"  # summaries shortlist, the exact mass within the shortlist reorders it


RERANK_FACTOR = 2  # the rerank shortlist: this many times the budget's blocks


def stored_layer_keys(
    store: BlockStore, geometry: KeyGeometry, layer: int, block_ids: Sequence[int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Keys of `layer` for the blocks: float32 [n_keys, n_head_kv, head_dim], positions
    int64 [n_keys] and the owning block's index into `block_ids`, int64 [n_keys]."""
    keys, positions, owners = [], [], []
    for i, block_id in enumerate(block_ids):
        block = store.get(block_id)
        rows = dequantize_rows(np.asarray(block.k[layer]), geometry.k_type, geometry.n_embd_k)
        keys.append(rows.reshape(block.n_tokens, geometry.n_head_kv, geometry.head_dim))
        positions.append(np.asarray(block.positions, dtype=np.int64))
        owners.append(np.full(block.n_tokens, i, dtype=np.int64))
    k = np.concatenate(keys).astype(np.float32)  # [n_keys, n_head_kv, head_dim]
    if geometry.k_rotation:
        k = undo_hadamard(k, geometry.k_rotation)
    return k, np.concatenate(positions), np.concatenate(owners)


def layer_block_mass(
    q: np.ndarray,
    q_pos: np.ndarray,
    k: np.ndarray,
    k_pos: np.ndarray,
    owners: np.ndarray,
    n_blocks: int,
) -> np.ndarray:
    """float64 [n_blocks]: the causal softmax mass of each block, summed over query rows
    and heads, divided by their count (a row that sees no key adds nothing).

    q float32 [n_rows, n_head, head_dim]; k float32 [n_keys, n_head_kv, head_dim];
    owners int64 [n_keys] in [0, n_blocks). Query head h uses KV head h // group.
    """
    n_rows, n_head, head_dim = q.shape
    n_kv = k.shape[1]
    if n_head % n_kv:
        raise MemoryLayoutError(f"{n_head} query heads do not group over {n_kv} KV heads")
    group = n_head // n_kv
    scale = np.float32(1.0 / math.sqrt(head_dim))
    kt = np.ascontiguousarray(k.transpose(1, 2, 0))  # [n_kv, head_dim, n_keys]
    per_key = np.zeros(k.shape[0], dtype=np.float64)  # mass summed over rows and heads
    for r0 in range(0, n_rows, _ROW_CHUNK):
        qq = q[r0 : r0 + _ROW_CHUNK]  # [m, n_head, head_dim]
        m = qq.shape[0]
        grouped = qq.reshape(m, n_kv, group, head_dim).transpose(1, 0, 2, 3)
        grouped = grouped.reshape(n_kv, m * group, head_dim)  # [n_kv, m*group, head_dim]
        logits = np.matmul(grouped, kt)  # [n_kv, m*group, n_keys]
        logits *= scale
        visible = k_pos[None, :] <= q_pos[r0 : r0 + m, None]  # [m, n_keys]
        if not visible.all():
            mask = np.repeat(visible, group, axis=0)[None]  # [1, m*group, n_keys]
            np.copyto(logits, np.float32(-np.inf), where=~mask)
        peak = logits.max(axis=-1, keepdims=True)  # [n_kv, m*group, 1]
        peak[~np.isfinite(peak)] = 0.0
        logits -= peak
        np.exp(logits, out=logits)  # the unnormalized weights
        denom = logits.sum(axis=-1)  # [n_kv, m*group]
        seen = np.repeat(visible.any(axis=1), group)[None, :]  # [1, m*group]
        inv = np.where(seen & (denom > 0), 1.0 / np.where(denom > 0, denom, 1.0), 0.0)
        # sum over rows of weight / denom: one [1, m*group] x [m*group, n_keys] per KV head
        per_key += np.matmul(inv.astype(np.float32)[:, None, :], logits).sum(axis=(0, 1))
    total = np.bincount(owners, weights=per_key, minlength=n_blocks)  # [n_blocks]
    return total / (n_rows * n_head)


def exact_block_scores(
    store: BlockStore,
    geometry: KeyGeometry,
    candidates: Sequence[int],
    query: QueryVectors,
    among: Sequence[int] | None = None,
) -> np.ndarray:
    """float32 [n_candidates]: each candidate's exact attention mass from the query rows,
    normalized over every stored block before the query's last row (or over the blocks
    `among`, which hold every candidate), averaged over layers. Empty candidates: empty
    array."""
    if not candidates:
        return np.zeros(0, dtype=np.float32)
    if not query.by_layer:
        raise MemoryLayoutError("the query has no captured layers to score with")
    q_pos = np.asarray(query.positions, dtype=np.int64)  # [n_rows]
    last = int(q_pos.max())
    pool = store.block_ids() if among is None else sorted(set(among) | set(candidates))
    stored = [b for b in pool if b in store and int(store.get(b).positions[0]) <= last]
    missing = set(candidates) - set(stored)
    if missing:
        raise MemoryLayoutError(f"candidate blocks {sorted(missing)} are not stored")
    index = {b: i for i, b in enumerate(stored)}
    mass = np.zeros(len(stored), dtype=np.float64)
    for layer in sorted(query.by_layer):
        k, k_pos, owners = stored_layer_keys(store, geometry, layer, stored)
        q = np.asarray(query.by_layer[layer], dtype=np.float32)  # [n_rows, n_head, head_dim]
        mass += layer_block_mass(q, q_pos, k, k_pos, owners, len(stored))
    mass /= len(query.by_layer)
    return np.asarray([mass[index[b]] for b in candidates], dtype=np.float32)


def rerank_scores(
    store: BlockStore,
    geometry: KeyGeometry,
    candidates: Sequence[int],
    summary: np.ndarray,
    query: QueryVectors,
    shortlist: int,
    pinned: Sequence[int] = (),
) -> np.ndarray:
    """float32 [n_candidates]: the `shortlist` best candidates by `summary` score
    (ties: the newer block) reordered by their exact mass, normalized over the shortlist
    and the `pinned` blocks (the rest of the window, which the query rows also attend
    to), ranked above every other candidate, which keeps its summary score (the
    summaries sum to 1: the shortlist's scores are 1 + its exact share)."""
    out = np.asarray(summary, dtype=np.float32).copy()  # [n_candidates]
    if len(candidates) == 0 or shortlist <= 0:
        return out
    order = sorted(range(len(candidates)), key=lambda i: (-float(out[i]), -candidates[i]))
    best = [candidates[i] for i in order[:shortlist]]
    exact = exact_block_scores(store, geometry, best, query, among=[*best, *pinned])
    for i, value in zip(order[:shortlist], exact, strict=True):
        out[i] = 1.0 + float(value)
    return out
