"""The turn's KVMEM_PREFILL, KVMEM_QUERY and KVMEM_GEN records."""

from __future__ import annotations

from collections.abc import Sequence

from kvmem.memory.scorer import QueryVectors
from kvmem.memory.spans import TokenSpan

from ..trace import TraceKind, Tracer, TurnStats


def _spans(spans: Sequence[TokenSpan]) -> str:
    return ",".join(f"{s.start}-{s.end}" for s in spans)


def trace_prefill(tracer: Tracer, n: int, reused: int, stats: TurnStats) -> None:
    tracer.emit(
        TraceKind.PREFILL,
        tokens=n,
        reused=reused,
        reprocessed=stats.reprocessed_tokens,
        new=n - reused,
        deferred=stats.deferred_tokens,
        replayed=stats.replayed_tokens,
        stage_in=stats.stage_in_blocks,
        harvested=stats.harvested_blocks,
        bytes_in=stats.stage_in_bytes,
        harvested_bytes=stats.harvested_bytes,
        ms=stats.prefill_ms,
    )


def trace_query(
    tracer: Tracer,
    at: int,
    wanted: Sequence[TokenSpan],
    query: QueryVectors | None,
    missing: Sequence[TokenSpan],
) -> None:
    """The wanted spans, the query's tokens, and the spans that had no vectors."""
    if not wanted:
        return
    tracer.emit(
        TraceKind.QUERY,
        at=at,
        spans=_spans(wanted),
        tokens=0 if query is None else len(query.positions),
        missing=_spans(missing) or "-",
    )


def trace_gen(tracer: Tracer, stats: TurnStats, cells: int, host_blocks: int, drafts: bool) -> None:
    """The turn's end; `drafts`: a spec decoder ran (its draft counts are written)."""
    more = {"draft_n": stats.draft_n, "draft_accepted": stats.draft_n_accepted} if drafts else {}
    tracer.emit(
        TraceKind.GEN,
        tokens=stats.generated_tokens,
        ms=stats.decode_ms,
        spilled=stats.spilled_blocks,
        finish=stats.finish_reason,
        cells=cells,
        host_blocks=host_blocks,
        **more,
    )
