"""Block scores: a block-level attention estimate of the query against the block summaries.

For every scored layer that the query has vectors for, the query tokens (RoPE removed)
attend over the blocks (softmax over blocks, per token and query head), each block
standing in with the upper bound of q.k over its keys, from the per-channel min/max
(`ScoreMode.KEY_BOUND`, as in Quest), or with its mean key (`ScoreMode.MEAN_KEY`); the
distributions are averaged over tokens, heads and layers. Grouped-query attention maps
query head h to KV head h // (n_head // n_head_kv), as llama.cpp does.

Cost: n_layers x n_tokens x n_head x n_blocks logits, each a head_dim dot product and
an exp. It grows with the history, so `max_logits` bounds it: past the bound, the query
tokens scored are an even sample of each query span (its last token always in it), a
function of the query alone (`sample_rows`). The logits are computed in chunks of
`_CHUNK_ELEMENTS`; with `workers > 1` the chunks run on a thread pool (numpy releases the
GIL in matmul and exp). The result does not depend on `workers`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from kvmem.errors import MemoryLayoutError
from kvmem.memory.retrieval_index import KeyGeometry, RetrievalIndex
from kvmem.memory.rope import remove_rope

logger = logging.getLogger(__name__)

_CHUNK_ELEMENTS = 1 << 22  # logits computed at once per task (16 MiB of float32)


class ScoreMode(Enum):
    """How a block's keys stand in for it when a query token attends to it."""

    KEY_BOUND = "bound"  # upper bound of q.k from per-channel min/max (Quest): the default
    MEAN_KEY = "mean"  # q . mean key


class ScoreAggregate(Enum):
    """How the per-row attention distributions over blocks become one score per block."""

    MEAN = "mean"  # the mean over query tokens and heads (then layers)
    MAX = "max"  # the largest share any query row gives the block (mean over layers): default


@dataclass(slots=True)
class QueryVectors:
    """Post-RoPE query vectors of the query tokens, as llama.cpp computed them."""

    positions: np.ndarray  # int [n_tokens]
    # layer -> float32 [n_tokens, n_head, head_dim]
    by_layer: dict[int, np.ndarray] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Chunk:
    """Some query rows of one layer against every block."""

    layer_pos: int  # index into the layers used
    queries: np.ndarray  # float32 [n_kv, n_rows, d'], RoPE removed (d' = 2 head_dim: [q+, q-])
    keys: np.ndarray  # float32 [n_kv, d', n_blocks], the layer's mean keys or [max; min]


def score_blocks(
    index: RetrievalIndex,
    block_ids: Sequence[int],
    query: QueryVectors,
    *,
    workers: int = 1,
    mode: ScoreMode = ScoreMode.KEY_BOUND,
    aggregate: ScoreAggregate = ScoreAggregate.MEAN,
    max_logits: int = 0,
) -> np.ndarray:
    """float32 [n_blocks]: the estimated attention mass of each block; sums to 1.

    An empty block list gives an empty array. Raises MemoryLayoutError when the query
    has none of the index's scored layers or its shapes do not fit the geometry.
    `workers` > 1 computes the chunks of logits on that many threads. `max_logits` > 0
    scores an even sample of the query tokens when all of them would exceed that many
    logits (`sample_rows`).
    """
    ids = list(block_ids)
    if not ids:
        return np.zeros(0, dtype=np.float32)  # [0]
    geometry = index.geometry
    used = [(j, layer) for j, layer in enumerate(index.layers) if layer in query.by_layer]
    if not used:
        raise MemoryLayoutError(
            f"the query has vectors for layers {sorted(query.by_layer)}, "
            f"none of the scored layers {list(index.layers)}"
        )
    query = _bounded_query(query, [layer for _, layer in used], len(ids), max_logits)
    positions = np.asarray(query.positions)  # [n_tokens]
    keys_by_layer = _block_keys(index, ids, mode)  # [n_blocks, n_scored, n_kv, d or 2d]
    n_blocks, n_kv = len(ids), geometry.n_head_kv
    chunks: list[_Chunk] = []
    n_rows: list[int] = []  # per used layer: query rows (tokens x heads)
    for pos, (j, layer) in enumerate(used):
        q = np.asarray(query.by_layer[layer], dtype=np.float32)  # [n_tokens, n_head, head_dim]
        n_tokens, n_head, head_dim = _check_query(q, positions, geometry, layer)
        group = n_head // n_kv
        content = remove_rope(q, positions, geometry.rope)  # [n_tokens, n_head, head_dim]
        # query head h = kvh * group + g attends with KV head kvh: [n_kv, n_tokens * group, head_dim]
        grouped = content.reshape(n_tokens, n_kv, group, head_dim).transpose(1, 0, 2, 3)
        grouped = np.ascontiguousarray(grouped).reshape(n_kv, n_tokens * group, head_dim)
        if mode is ScoreMode.KEY_BOUND:
            # max(q.min, q.max) per channel = q+ . max + q- . min: one product on [q+, q-]
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


def _bounded_query(
    query: QueryVectors, layers: list[int], n_blocks: int, max_logits: int
) -> QueryVectors:
    """The query, or the sample of its tokens that keeps the logits within `max_logits`."""
    if max_logits <= 0:
        return query
    first = np.asarray(query.by_layer[layers[0]])  # [n_tokens, n_head, head_dim]
    n_head = first.shape[1] if first.ndim == 3 else 1
    rows = sample_rows(query.positions, max_logits // (len(layers) * n_head * n_blocks))
    if rows is None:
        return query
    return QueryVectors(
        positions=np.asarray(query.positions)[rows],  # [n_sampled]
        by_layer={layer: np.asarray(query.by_layer[layer])[rows] for layer in layers},
    )


def sample_rows(positions: np.ndarray, limit: int) -> np.ndarray | None:
    """int64 [<= limit]: the query tokens scored when there are more than `limit` (at
    least one per span), else None (all of them).

    The query is one or more spans of consecutive positions (task, trajectory). Each span
    keeps a share of `limit` proportional to its length, evenly spaced and always with its
    last token (the one nearest to what is generated next).
    """
    pos = np.asarray(positions, dtype=np.int64)  # [n_tokens]
    n = len(pos)
    limit = max(1, limit)
    if n <= limit:
        return None
    bounds = np.flatnonzero(np.diff(pos) != 1) + 1
    starts = np.concatenate([[0], bounds]).astype(np.int64)  # [n_spans]
    ends = np.concatenate([bounds, [n]]).astype(np.int64)  # [n_spans]
    picks: list[np.ndarray] = []
    for lo, hi in zip(starts.tolist(), ends.tolist(), strict=True):
        k = max(1, (limit * (hi - lo)) // n)
        # k evenly spaced rows of [lo, hi), the last one at hi - 1
        picks.append(hi - 1 - ((hi - lo) * np.arange(k - 1, -1, -1, dtype=np.int64)) // k)
    return np.concatenate(picks)  # [<= limit + n_spans]


def _block_keys(index: RetrievalIndex, ids: list[int], mode: ScoreMode) -> np.ndarray:
    """float32 [n_blocks, n_scored, n_kv, head_dim] means, or [..., 2 * head_dim] (max, min)."""
    if mode is ScoreMode.MEAN_KEY:
        return index.means(ids)
    mins, maxs = index.bounds(ids)
    return np.concatenate([maxs, mins], axis=-1)


def _softmax_columns(chunk: _Chunk, scale: np.float32, use_max: bool) -> np.ndarray:
    """float64 [n_blocks]: the sum (or max) over the chunk's query rows of
    softmax_b(q . k_b * scale)."""
    logits = np.matmul(chunk.queries, chunk.keys)  # [n_kv, n_rows, n_blocks]
    logits *= scale
    logits -= logits.max(axis=-1, keepdims=True)
    np.exp(logits, out=logits)
    logits /= logits.sum(axis=-1, keepdims=True)
    rows = logits.reshape(-1, logits.shape[-1])  # [n_kv * n_rows, n_blocks]
    if use_max:
        return rows.max(axis=0).astype(np.float64)  # [n_blocks]
    return rows.sum(axis=0, dtype=np.float64)  # [n_blocks]


def _check_query(
    q: np.ndarray, positions: np.ndarray, geometry: KeyGeometry, layer: int
) -> tuple[int, int, int]:
    n_head_kv, head_dim = geometry.n_head_kv, geometry.head_dim
    if q.ndim != 3 or positions.ndim != 1 or q.shape[0] != positions.shape[0] or q.shape[0] == 0:
        raise MemoryLayoutError(
            f"layer {layer}: query {list(q.shape)} with positions {list(positions.shape)}; "
            "expected [n_tokens > 0, n_head, head_dim] and [n_tokens]"
        )
    n_tokens, n_head, q_dim = q.shape
    if q_dim != head_dim or n_head % n_head_kv:
        raise MemoryLayoutError(
            f"layer {layer}: query {list(q.shape)} does not fit {n_head_kv} KV heads of {head_dim}"
        )
    return n_tokens, n_head, q_dim
