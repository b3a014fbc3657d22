"""Session 4's block scorer, kept so that `kvmem-bench score-cost` measures against it.

The summaries lay in one array float32 [capacity, 3, n_scored, n_kv, head_dim], row per
block; each call gathered the candidates' rows, transposed every layer's keys into
[n_kv, d', n_blocks] and computed the logits in chunks of `_CHUNK_ELEMENTS` (optionally on
a thread pool). `memory.scorer.score_blocks` replaced it; this copy is the algorithm as it
was, for the measurement only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from kvmem.memory.retrieval_index import KeyGeometry
from kvmem.memory.rope import remove_rope
from kvmem.memory.scorer import QueryVectors, ScoreAggregate, ScoreMode, bounded_query
from kvmem.memory.summary_table import STAT_MAX, STAT_MEAN, STAT_MIN

_CHUNK_ELEMENTS = 1 << 22  # logits computed at once per task (16 MiB of float32)


@dataclass(frozen=True, slots=True)
class BaselineIndex:
    """The old layout: float32 [n_rows, 3, n_scored, n_kv, head_dim], block id = row."""

    geometry: KeyGeometry
    layers: tuple[int, ...]
    stats: np.ndarray


@dataclass(frozen=True, slots=True)
class _Chunk:
    layer_pos: int  # index into the layers used
    queries: np.ndarray  # float32 [n_kv, n_rows, d']
    keys: np.ndarray  # float32 [n_kv, d', n_blocks]


def baseline_scores(
    index: BaselineIndex,
    block_ids: Sequence[int],
    query: QueryVectors,
    *,
    workers: int = 1,
    mode: ScoreMode = ScoreMode.KEY_BOUND,
    aggregate: ScoreAggregate = ScoreAggregate.MEAN,
    max_logits: int = 0,
) -> np.ndarray:
    """float32 [n_blocks]: session 4's `score_blocks` (a non-empty, valid query assumed)."""
    ids = np.asarray(block_ids, dtype=np.int64)  # [n_blocks]
    geometry = index.geometry
    used = [(j, layer) for j, layer in enumerate(index.layers) if layer in query.by_layer]
    query = bounded_query(query, [layer for _, layer in used], len(ids), max_logits)
    positions = np.asarray(query.positions)  # [n_tokens]
    if mode is ScoreMode.MEAN_KEY:
        keys_by_layer = index.stats[ids, STAT_MEAN]  # [n_blocks, n_scored, n_kv, d]
    else:  # [n_blocks, n_scored, n_kv, 2d]
        keys_by_layer = np.concatenate(
            [index.stats[ids, STAT_MAX], index.stats[ids, STAT_MIN]], axis=-1
        )
    n_blocks, n_kv = len(ids), geometry.n_head_kv
    chunks: list[_Chunk] = []
    n_rows: list[int] = []  # per used layer: query rows (tokens x heads)
    for pos, (j, layer) in enumerate(used):
        q = np.asarray(query.by_layer[layer], dtype=np.float32)  # [n_tokens, n_head, head_dim]
        n_tokens, n_head, head_dim = q.shape
        group = n_head // n_kv
        content = remove_rope(q, positions, geometry.rope)  # [n_tokens, n_head, head_dim]
        grouped = content.reshape(n_tokens, n_kv, group, head_dim).transpose(1, 0, 2, 3)
        grouped = np.ascontiguousarray(grouped).reshape(n_kv, n_tokens * group, head_dim)
        if mode is ScoreMode.KEY_BOUND:
            grouped = np.concatenate([np.maximum(grouped, 0), np.minimum(grouped, 0)], axis=-1)
        keys = np.ascontiguousarray(keys_by_layer[:, j].transpose(1, 2, 0))  # [n_kv, d', n_blocks]
        step = max(1, _CHUNK_ELEMENTS // (n_kv * n_blocks))
        for r0 in range(0, n_tokens * group, step):
            chunks.append(_Chunk(pos, grouped[:, r0 : r0 + step], keys))
        n_rows.append(n_tokens * n_head)
    scale = np.float32(1.0 / math.sqrt(geometry.head_dim))
    use_max = aggregate is ScoreAggregate.MAX
    if workers > 1 and len(chunks) > 1:
        with ThreadPoolExecutor(max_workers=min(workers, len(chunks))) as pool:
            partials = list(pool.map(lambda c: _softmax_columns(c, scale, use_max), chunks))
    else:
        partials = [_softmax_columns(c, scale, use_max) for c in chunks]
    per_layer = np.zeros((len(used), n_blocks), dtype=np.float64)  # [n_used, n_blocks]
    for chunk, partial in zip(chunks, partials, strict=True):
        if use_max:
            np.maximum(per_layer[chunk.layer_pos], partial, out=per_layer[chunk.layer_pos])
        else:
            per_layer[chunk.layer_pos] += partial
    if use_max:
        per_layer /= per_layer.sum(axis=1, keepdims=True)
    else:
        per_layer /= np.asarray(n_rows, dtype=np.float64)[:, None]
    return per_layer.mean(axis=0).astype(np.float32)  # [n_blocks]


def _softmax_columns(chunk: _Chunk, scale: np.float32, use_max: bool) -> np.ndarray:
    """float64 [n_blocks]: the sum (or max) over the chunk's rows of softmax_b(q.k_b scale)."""
    logits = np.matmul(chunk.queries, chunk.keys)  # [n_kv, n_rows, n_blocks]
    logits *= scale
    logits -= logits.max(axis=-1, keepdims=True)
    np.exp(logits, out=logits)
    logits /= logits.sum(axis=-1, keepdims=True)
    rows = logits.reshape(-1, logits.shape[-1])  # [n_kv * n_rows, n_blocks]
    if use_max:
        return rows.max(axis=0).astype(np.float64)  # [n_blocks]
    return rows.sum(axis=0, dtype=np.float64)  # [n_blocks]
