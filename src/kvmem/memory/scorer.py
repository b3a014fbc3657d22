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
function of the query alone (`sample_rows`).

The summaries come from the `SummaryTable` (per layer and KV head, one row per block): each
layer gathers the candidates' rows, in the candidates' order, and each (layer, KV head) is
one product of its query rows with them. So a score depends on the candidates and the
query alone, not on the other rows the table holds (a block summarized later, a row moved
by a removal), and the table may take new summaries on another thread meanwhile. The query
of a layer is prepared once (RoPE removed, scaled, grouped by KV head, [q+ | q-] for the
bound). With `workers > 1` the layers run on
a thread pool (numpy releases the GIL in matmul and exp), OpenBLAS on one thread per product
meanwhile (`blas_threads`), since it runs one multi-threaded product at a time. The result
does not depend on `workers`.
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
from kvmem.memory.blas_threads import single_threaded_blas
from kvmem.memory.lexical import LexicalQuery
from kvmem.memory.retrieval_index import KeyGeometry, RetrievalIndex
from kvmem.memory.rope import remove_rope

logger = logging.getLogger(__name__)

_CHUNK_ELEMENTS = 1 << 20  # logits computed at once (4 MiB of float32, cache-sized)


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
    lexical: LexicalQuery | None = None  # the task and last message, for BM25 (lexical.py)


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
    has none of the index's scored layers or its shapes do not fit the geometry, or a
    block is not in the index. `workers` > 1 scores the layers on that many threads,
    each product on one OpenBLAS thread.
    `max_logits` > 0 scores an even sample of the query tokens when all of them would
    exceed that many logits over the candidates (`sample_rows`).
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
    query = bounded_query(query, [layer for _, layer in used], len(ids), max_logits)
    positions = np.asarray(query.positions)  # [n_tokens]
    for _, layer in used:
        _check_query(np.asarray(query.by_layer[layer]), positions, geometry, layer)
    table = index.score_table(ids)
    rows = table.rows(ids)  # [n_blocks]
    bound = mode is ScoreMode.KEY_BOUND
    use_max = aggregate is ScoreAggregate.MAX

    def one_layer(job: tuple[int, int]) -> np.ndarray:
        j, layer = job
        q = _prepared_query(query.by_layer[layer], positions, geometry, mode)  # [n_kv, n, d']
        return _layer_scores(q, table.gather(j, rows, bound), use_max)  # [n_blocks]

    if workers > 1 and len(used) > 1:
        with single_threaded_blas(), ThreadPoolExecutor(min(workers, len(used))) as pool:
            per_layer = np.stack(list(pool.map(one_layer, used)))  # [n_used, n_blocks]
    else:
        per_layer = np.stack([one_layer(job) for job in used])  # [n_used, n_blocks]
    if use_max:
        per_layer /= per_layer.sum(axis=1, keepdims=True)
    else:
        n_head = np.asarray(query.by_layer[used[0][1]]).shape[1]
        per_layer /= float(len(positions) * n_head)
    return per_layer.mean(axis=0).astype(np.float32)  # [n_blocks]


def _prepared_query(
    q: np.ndarray, positions: np.ndarray, geometry: KeyGeometry, mode: ScoreMode
) -> np.ndarray:
    """float32 [n_kv, n_tokens * group, d']: one layer's query rows per KV head, RoPE removed
    and scaled by 1/sqrt(head_dim); for the bound score d' = 2 head_dim, rows [q+ | q-]."""
    n_tokens, n_head, head_dim = q.shape
    n_kv = geometry.n_head_kv
    group = n_head // n_kv
    scale = np.float32(1.0 / math.sqrt(head_dim))
    content = remove_rope(np.asarray(q, dtype=np.float32), positions, geometry.rope)
    content *= scale  # [n_tokens, n_head, head_dim]
    # query head h = kvh * group + g attends with KV head kvh: [n_kv, n_tokens * group, head_dim]
    grouped = content.reshape(n_tokens, n_kv, group, head_dim).transpose(1, 0, 2, 3)
    grouped = np.ascontiguousarray(grouped).reshape(n_kv, n_tokens * group, head_dim)
    if mode is ScoreMode.MEAN_KEY:
        return grouped
    # max(q.min, q.max) per channel = q+ . max + q- . min: one product on [q+, q-]
    return np.concatenate([np.maximum(grouped, 0), np.minimum(grouped, 0)], axis=-1)


def _layer_scores(q: np.ndarray, keys: np.ndarray, use_max: bool) -> np.ndarray:
    """float64 [n_blocks]: the max (or sum) over one layer's query rows of
    softmax_b(q . k_b) over the blocks b.

    q float32 [n_kv, n_rows, d'] (scaled); keys float32 [n_kv, n_blocks, d'], one row
    per block. The logits are computed in tiles of at most `_CHUNK_ELEMENTS`.
    """
    n_kv, n_rows, _ = q.shape
    out = np.zeros(keys.shape[1], dtype=np.float64)  # [n_blocks]
    step = max(1, _CHUNK_ELEMENTS // keys.shape[1])
    for kvh in range(n_kv):
        for r0 in range(0, n_rows, step):
            logits = q[kvh, r0 : r0 + step] @ keys[kvh].T  # [rows, n_blocks]
            logits -= logits.max(axis=1, keepdims=True)
            np.exp(logits, out=logits)
            weights = np.reciprocal(logits.sum(axis=1))  # [rows]: 1 / each row's sum
            if use_max:
                logits *= weights[:, None]
                np.maximum(out, logits.max(axis=0), out=out)
            else:
                out += weights @ logits  # [n_blocks]
    return out


def bounded_query(
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
