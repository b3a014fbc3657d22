"""`kvmem-bench score-cost`: the time one reselection spends scoring, old path against new.

Scoring is numpy on the host: n_layers x query tokens x query heads x blocks logits, each
a dot product over the block summaries. This command builds an index of random summaries
at a model's shape and history length (default: the 8B Llama shape at 250K tokens in
128-token blocks, 23 scored layers, a 1,024-token query, the newest `--pinned` blocks not
candidates) and times, for each `--mlogits` x `--threads` pair in this one run, session
4's scorer over its layout (`score_baseline`, the gather and transposes per call) and
today's `score_blocks` over the `SummaryTable`, with their ratio, the largest relative
difference of their scores and whether their top-k blocks agree. It also reports how many
query tokens each bound keeps and whether the top-k blocks stay those of the unbounded
scores, and (`--summary-blocks N`) the time to summarize one harvest of N blocks whose K is
q8_0 with the Hadamard rotation, as the index workers do for every block.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from functools import partial

import numpy as np

from kvmem.bench.report import format_table, machine_description, write_json
from kvmem.bench.score_baseline import BaselineIndex, baseline_scores
from kvmem.cli.kvmem_flags import strict_int
from kvmem.memory.blas_threads import blas_threads
from kvmem.memory.ggml_types import GgmlType
from kvmem.memory.retrieval_index import (
    BlockKeys,
    KeyGeometry,
    RetrievalIndex,
    default_score_layers,
)
from kvmem.memory.rope import RopeParams, RopeType, k_rotation_size
from kvmem.memory.scorer import QueryVectors, ScoreAggregate, sample_rows, score_blocks
from kvmem.memory.summary_table import N_STATS


def _indexes(
    ns: argparse.Namespace, rng: np.random.Generator
) -> tuple[RetrievalIndex, BaselineIndex]:
    """The same random summaries in today's index and in session 4's layout."""
    geometry = KeyGeometry(
        ns.n_layer, ns.n_head_kv, ns.head_dim, GgmlType.F16,
        RopeParams(RopeType.NORM, ns.head_dim, 500000.0), 0,
    )  # fmt: skip
    layers = default_score_layers(ns.n_layer)
    index = RetrievalIndex(geometry, layers)
    shape = (ns.blocks, N_STATS, len(layers), ns.n_head_kv, ns.head_dim)
    stats = rng.standard_normal(shape).astype(np.float32)  # [blocks, 3, layers, kv, hd]
    stats[:, 1] = -np.abs(stats[:, 1])  # min <= max
    stats[:, 2] = np.abs(stats[:, 2])
    index.put(list(range(ns.blocks)), stats)
    return index, BaselineIndex(geometry, layers, stats)


def _query(ns: argparse.Namespace, layers: Sequence[int], rng: np.random.Generator) -> QueryVectors:
    half = ns.query_tokens // 2  # a task span and a trajectory tail, as the agent policy
    first = ns.blocks * ns.block_tokens // 8
    last = ns.blocks * ns.block_tokens - half
    positions = np.concatenate([np.arange(first, first + half), np.arange(last, last + half)])
    shape = (len(positions), ns.n_head, ns.head_dim)
    by_layer = {layer: rng.standard_normal(shape).astype(np.float32) for layer in layers}
    return QueryVectors(positions=positions.astype(np.int64), by_layer=by_layer)  # [n_tokens]


def summary_ms(ns: argparse.Namespace, rng: np.random.Generator) -> float:
    """Milliseconds per block to summarize `--summary-blocks` random q8_0 blocks (rotated
    K, as llama.cpp stores a quantized K cache) at the shape: the best of three batches."""
    rotation = k_rotation_size(ns.head_dim)
    geometry = KeyGeometry(
        ns.n_layer, ns.n_head_kv, ns.head_dim, GgmlType.Q8_0,
        RopeParams(RopeType.NORM, ns.head_dim, 500000.0), rotation,
    )  # fmt: skip
    index = RetrievalIndex(geometry, default_score_layers(ns.n_layer))
    n, bt, row = ns.summary_blocks, ns.block_tokens, geometry.k_row_bytes
    scale = np.frombuffer(np.float16(0.01).tobytes(), dtype=np.uint8)  # [2]
    blocks = []
    for b in range(n):
        rows = rng.integers(0, 256, size=(ns.n_layer, bt, row), dtype=np.uint8)  # [L, bt, row]
        rows.reshape(ns.n_layer, bt, -1, 34)[..., :2] = scale  # q8_0 blocks: a sane f16 scale
        blocks.append(BlockKeys(b, np.arange(b * bt, (b + 1) * bt), list(rows)))
    best = min(_timed(partial(index.summarize, blocks))[1] for _ in range(3))
    return best * 1e3 / n


def _timed(score: Callable[[], np.ndarray]) -> tuple[np.ndarray, float]:
    t0 = time.perf_counter()
    scores = score()
    return scores, time.perf_counter() - t0


def _top(scores: np.ndarray, k: int) -> set[int]:
    return set(np.argsort(-scores, kind="stable")[:k].tolist())


def run(ns: argparse.Namespace) -> int:
    rng = np.random.default_rng(ns.seed)
    index, baseline = _indexes(ns, rng)
    query = _query(ns, index.layers, rng)
    ids = list(range(ns.blocks - ns.pinned))  # the candidates: all but the newest blocks
    per_token = len(index.layers) * ns.n_head * len(ids)
    reference: np.ndarray | None = None
    rows, results = [], []
    for mlogits in ns.mlogits:
        for threads in ns.threads:
            kw = {"workers": threads, "aggregate": ScoreAggregate.MAX,
                  "max_logits": mlogits * 1_000_000}  # fmt: skip
            old, old_s = _timed(partial(baseline_scores, baseline, ids, query, **kw))
            new, new_s = _timed(partial(score_blocks, index, ids, query, **kw))
            reference = new if reference is None else reference
            kept = len(_top(reference, ns.top_k) & _top(new, ns.top_k)) / ns.top_k
            agree = len(_top(old, ns.top_k) & _top(new, ns.top_k)) / ns.top_k
            rel = float(np.max(np.abs(new - old) / np.abs(old)))
            sampled = (
                sample_rows(query.positions, mlogits * 1_000_000 // per_token) if mlogits else None
            )
            tokens = len(query.positions) if sampled is None else len(sampled)
            rows.append([mlogits or "none", threads, tokens, f"{old_s * 1e3:.0f}",
                         f"{new_s * 1e3:.0f}", f"{old_s / new_s:.2f}", f"{rel:.1e}",
                         f"{agree:.2f}", f"{kept:.2f}"])  # fmt: skip
            results.append({"mlogits": mlogits, "threads": threads, "query_tokens": tokens,
                            "old_seconds": old_s, "new_seconds": new_s, "max_rel_diff": rel,
                            "top_k_old_new": agree, "top_k_kept": kept})  # fmt: skip
    head = ["mlogits", "threads", "query tokens", "old ms", "new ms", "old/new", "max rel diff",
            f"top-{ns.top_k} old=new", f"top-{ns.top_k} kept"]  # fmt: skip
    title = (
        f"score cost: {len(ids)} of {ns.blocks} blocks x {len(index.layers)} layers x "
        f"{ns.n_head} heads, {ns.query_tokens}-token query, OpenBLAS threads {blas_threads()}"
    )
    print(format_table(head, rows, title))
    summary = summary_ms(ns, rng) if ns.summary_blocks else None
    if summary is not None:
        print(
            f"block summaries: {summary:.1f} ms per block ({ns.summary_blocks} q8_0 blocks at once)"
        )
    if ns.out:
        write_json(ns.out, "score_cost.json", {"machine": machine_description(), "results": results,
                                               "summary_ms_per_block": summary,
                                               "shape": {k: getattr(ns, k) for k in _SHAPE}})  # fmt: skip
    return 0


_SHAPE = (
    "blocks",
    "pinned",
    "block_tokens",
    "n_layer",
    "n_head",
    "n_head_kv",
    "head_dim",
    "query_tokens",
)


def _int_list(text: str) -> list[int]:
    return [strict_int(x) for x in text.split(",") if x]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "score-cost", help="reselection scoring time, old path and new, by threads and bound"
    )
    p.add_argument("--blocks", type=strict_int, default=1955, help="blocks in the history")
    p.add_argument("--pinned", type=strict_int, default=128,
                   help="newest blocks that are not candidates (the pinned tiers)")  # fmt: skip
    p.add_argument("--block-tokens", type=strict_int, default=128)
    p.add_argument("--n-layer", type=strict_int, default=36)
    p.add_argument("--n-head", type=strict_int, default=32)
    p.add_argument("--n-head-kv", type=strict_int, default=8)
    p.add_argument("--head-dim", type=strict_int, default=128)
    p.add_argument("--query-tokens", type=strict_int, default=1024)
    p.add_argument("--threads", type=_int_list, default=[1, 4, 8], metavar="N,N")
    p.add_argument("--mlogits", type=_int_list, default=[0, 128, 32], metavar="M,M",
                   help="bounds in millions of logits (0 = none)")  # fmt: skip
    p.add_argument("--top-k", type=strict_int, default=200)
    p.add_argument("--summary-blocks", type=strict_int, default=0,
                   help="also time summarizing this many q8_0 blocks at once (0 = no)")  # fmt: skip
    p.add_argument("--seed", type=strict_int, default=0)
    p.add_argument("--out", default=None, metavar="DIR")
    p.set_defaults(handler=run)
