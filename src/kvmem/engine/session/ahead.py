"""The scoring source's query work beside the prefill (query/query_ahead.py), set up for
one turn: the rows of the spans the cache lacks, then the plan's scores, then the restore
blobs of the plan once it is scored."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvmem.config import KVMemConfig, QueryAheadMode
from kvmem.memory.block_table import BlockTable
from kvmem.memory.exact_scorer import RankMode
from kvmem.memory.retrieval_index import RetrievalIndex

from ..query.block_scores import BlockScores
from ..query.query_ahead import QueryAhead, Rows
from ..query.query_cache import QueryCache
from ..query.scoring_context import ScoringContext
from ..trace import TurnStats
from .turn_plan import ChunkGrid, TurnPlan
from .window import GpuWindow
from .window_plans import StreamAt


@dataclass(slots=True)
class AheadParts:
    """What the query work ahead reads of one session."""

    scoring: ScoringContext | None
    config: KVMemConfig
    queries: QueryCache
    window: GpuWindow
    table: BlockTable
    index: RetrievalIndex | None
    grid: ChunkGrid
    hybrid: bool  # recurrent snapshots of its own: no work ahead


def begin_ahead(
    parts: AheadParts,
    prompt: Sequence[int],
    plan: TurnPlan,
    start: int,
    forced: Sequence[int],
    stats: TurnStats,
) -> QueryAhead | None:
    """Start the query work beside the prefill of [start, plan.end), or None: another
    source, `--kvmem-query-ahead off`, a hybrid (snapshots of its own) or images (the
    projector is shared with the main context)."""
    scoring, c = parts.scoring, parts.config
    if scoring is None or c.query_ahead is QueryAheadMode.OFF:
        return None
    if parts.hybrid or plan.spans.groups or not plan.wanted:
        return None
    wanted, end, window, queries = plan.wanted, plan.end, parts.window, parts.queries
    missing = queries.missing(wanted, prompt)
    request = window.request(plan.spans, forced, len(prompt) - end, end)
    ranked: tuple[int, ...] = ()
    if parts.index is not None and c.rank is RankMode.SUMMARY:  # the others read the store
        ranked = window.candidates(request)
    stream = None  # the window the last chunk sees (None: no chunk before the plan)
    if start < end:
        grid = parts.grid
        last = max(start, (end - 1) - (end - 1) % grid.chunk_tokens)
        room = window.capacity - grid.chunk_tokens
        stream = StreamAt(last, plan.spans, room, grid.stream_grid)

    def score(rows: Rows) -> BlockScores | None:
        query = queries.joined(wanted, rows, prompt, plan.lexical)
        return None if query is None else window.score(ranked, query)

    return QueryAhead(
        scoring.worker,
        lambda: scoring.query_rows(prompt, missing),
        len(missing),
        ranked,
        score,
        parts.table,
        lambda: stats.add(window.flush()),
        lambda scores: window.prepare_restore(request, scores, stream),
    )
