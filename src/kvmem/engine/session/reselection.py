"""Reselection's records and pure steps: the candidates' scores, the replay decision and
the trace of an applied plan. `GpuWindow.plan` builds a `Reselection` from them and
`GpuWindow.apply` carries it out."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from kvmem.config import KVMemConfig, LexicalMode, QueryReplay
from kvmem.memory.exact_scorer import RERANK_FACTOR, RankMode, exact_block_scores, rerank_scores
from kvmem.memory.host_store import BlockStore
from kvmem.memory.layout import tail_run_start
from kvmem.memory.lexical import bm25_scores, fuse_ranks
from kvmem.memory.planner import Tier, WindowPlan
from kvmem.memory.retrieval_index import RetrievalIndex
from kvmem.memory.scorer import QueryVectors, score_blocks
from kvmem.memory.spans import PromptSpans

from ..query.block_scores import BlockScores
from ..trace import Moves, TraceKind, Tracer

UNSCORED = BlockScores((), {}, 0.0, 0.0, 0.0)  # a plan that ranked nothing by score


@dataclass(frozen=True, slots=True)
class Reselection:
    """A plan for one query: the tiers, where each block sits, and the replay."""

    plan: WindowPlan
    starts: dict[int, int]  # block id -> first position, for every selected block
    replay_from: int | None  # position to re-decode from, None = no replay
    scores: BlockScores = UNSCORED  # what ranked the candidates, and its time


@dataclass(slots=True)
class Applied:
    """What applying a plan did."""

    stage_in: int = 0
    built_ahead: int = 0  # of the stage-ins, blocks whose blob was built beside the prefill
    bytes_in: int = 0
    evicted: int = 0
    moved: int = 0
    restore_ms: float = 0.0
    evict_ms: float = 0.0  # the evictions (restaged blocks too)
    move_ms: float = 0.0  # the shifts of resident blocks
    moves: Moves = field(default_factory=Moves)  # for the turn's stats


def score_candidates(
    index: RetrievalIndex,
    store: BlockStore,
    config: KVMemConfig,
    history: np.ndarray,
    ranked: Sequence[int],
    query: QueryVectors,
) -> BlockScores:
    """The candidates' scores for `query` (reads the index, the store and the complete
    blocks of `history`, int64 [n_tokens], only)."""
    c = config
    t_index = time.perf_counter()
    index.score_table(ranked)  # summaries still being computed: waited for here
    ts = time.perf_counter()
    if c.rank is RankMode.EXACT:  # the oracle: exact mass over the stored keys
        values = exact_block_scores(store, index.geometry, ranked, query)
    else:
        values = score_blocks(
            index,
            ranked,
            query,
            workers=c.score_workers,
            mode=c.score_mode,
            aggregate=c.score_aggregate,
            max_logits=c.score_mlogits * 1_000_000,
        )
    if c.rank is RankMode.RERANK:  # the shortlist reordered by its exact mass
        shortlist = RERANK_FACTOR * (c.budget // c.block_tokens)
        n_complete = history.shape[0] // c.block_tokens
        pinned = sorted(set(range(n_complete)) - set(ranked))
        values = rerank_scores(store, index.geometry, ranked, values, query, shortlist, pinned)
    lex = query.lexical
    if c.lexical is LexicalMode.FUSE and lex is not None:
        lexical = bm25_scores(
            history, c.block_tokens, ranked, lex.tokens, lex.positions, c.lexical_max_df
        )
        values = fuse_ranks(values, lexical, np.asarray(ranked, dtype=np.int64))
    t_end = time.perf_counter()
    return BlockScores(
        ranked=tuple(ranked),
        values={b: float(v) for b, v in zip(ranked, values, strict=True)},
        score_ms=(t_end - ts) * 1e3,
        index_ms=(ts - t_index) * 1e3,
        wait_ms=(t_end - t_index) * 1e3,
    )


def replay_start(
    config: KVMemConfig,
    seen: Mapping[int, int],
    plan: WindowPlan,
    starts: Mapping[int, int],
    spans: PromptSpans,
    n_prompt: int,
    n_complete: int,
) -> int | None:
    """Where to re-decode from so that the live tail sees the window chosen for it
    (`auto`: only when that window differs from the one it was computed against, `seen`)."""
    mode = config.query_replay
    if mode is QueryReplay.OFF:
        return None
    if mode is QueryReplay.AUTO:
        seen_n = max(seen, default=-1) + 1
        chosen = {b: p for b, p in starts.items() if b < seen_n}
        if chosen == seen:
            return None
    run = tail_run_start(set(plan.selected), n_complete) * config.block_tokens
    live = spans.live.start if spans.live is not None else 0
    start = max(live, n_prompt - config.query_pin_tokens, run, 1)
    return start if start < n_prompt else None


def trace_reselect(
    tracer: Tracer, res: Reselection, applied: Applied, ms: float, candidates: int
) -> None:
    plan, scores = res.plan, res.scores
    tiers = {f"{t.value}": plan.tier(t) for t in Tier}
    tracer.emit(
        TraceKind.RESELECT,
        candidates=candidates,
        selected=len(plan.selected),
        keep=len(plan.keep),
        stage_in=applied.stage_in,
        built_ahead=applied.built_ahead,
        evict=applied.evicted,
        moved=applied.moved,
        bytes_in=applied.bytes_in,
        ms=ms,
        score_ms=scores.score_ms,
        index_wait_ms=scores.index_ms,
        ahead="-" if scores.ahead_at < 0 else scores.ahead_at,
        score_wait_ms=scores.wait_ms,
        evict_ms=applied.evict_ms,
        move_ms=applied.move_ms,
        restore_ms=applied.restore_ms,
        replay="-" if res.replay_from is None else res.replay_from,
        **tiers,
    )
    for tier, blocks in plan.unpinned.items():
        tracer.emit(TraceKind.TIER_DROP, tier=tier.value, blocks=blocks)
