"""Where a turn's query vectors come from: one `QuerySource` per `--kvmem-query-source`.

- `MainSource` (`main`): the main context's eval callback captures the rows while the
  prompt is prefilled; the rows are kept by position for later turns (query_rows.py).
- `ScoringSource` (`scoring`): a scoring context of its own decodes the wanted spans from
  the prompt's tokens (beside the prefill when the query work goes ahead).
- `NoSource`: KVMem off, or a method that ranks by no query.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

from kvmem.config import KVMemConfig
from kvmem.memory.query_rows import QueryRows, merged
from kvmem.memory.spans import TokenSpan

from ..transfer.transfer_profile import TransferPath, TransferProfile
from .query_cache import QueryCache, SpanRows
from .query_capture import QueryCapture
from .scoring_context import ScoringContext
from .source_kind import SourceKind


class QuerySource(Protocol):
    kind: SourceKind

    def on_main(self, wanted: tuple[TokenSpan, ...], n: int) -> tuple[TokenSpan, ...]:
        """The spans whose rows the main context captures during this prefill."""
        ...

    def rows(
        self,
        prompt: Sequence[int],
        wanted: tuple[TokenSpan, ...],
        kept: tuple[TokenSpan, ...],
        captured: SpanRows,
        reused: int,
    ) -> SpanRows:
        """The wanted spans' rows once the prompt is prefilled (`captured`: the rows of the
        `kept` spans this prefill decoded, from `reused` on)."""
        ...


class NoSource:
    kind = SourceKind.NONE

    def on_main(self, wanted: tuple[TokenSpan, ...], n: int) -> tuple[TokenSpan, ...]:
        return ()

    def rows(self, prompt, wanted, kept, captured, reused) -> SpanRows:
        return {}


class MainSource:
    """Rows captured on the main context, kept by position in `rows`."""

    kind = SourceKind.MAIN

    def __init__(self, capture: QueryCapture, rows: QueryRows, config: KVMemConfig) -> None:
        self.capture = capture
        self.kept_rows = rows
        self.config = config

    def on_main(self, wanted: tuple[TokenSpan, ...], n: int) -> tuple[TokenSpan, ...]:
        """The wanted spans and the prompt's tail (the next turns' trajectory tail covers
        it), as disjoint spans."""
        if not wanted:
            return ()
        tail = TokenSpan(max(0, n - self.config.query_max_tokens), n)
        return tuple(merged((*wanted, tail)))

    def rows(self, prompt, wanted, kept, captured, reused) -> SpanRows:
        """Keep the rows captured this turn (from `reused` on) with those of earlier turns,
        forget the rest, and assemble every wanted span that has all of its rows."""
        for span in kept:
            if span in captured:
                self.kept_rows.add(max(span.start, reused), captured[span])
        self.kept_rows.keep_only(kept)
        return {s: v.by_layer for s in wanted if (v := self.kept_rows.vectors(s)) is not None}


class ScoringSource:
    """Rows decoded on the scoring context for the spans the cache does not hold (the
    same tokens at the same positions give the same rows)."""

    kind = SourceKind.SCORING

    def __init__(self, scoring: ScoringContext, cache: QueryCache, profile: TransferProfile):
        self.scoring = scoring
        self.cache = cache
        self.profile = profile

    def on_main(self, wanted: tuple[TokenSpan, ...], n: int) -> tuple[TokenSpan, ...]:
        return ()

    def rows(self, prompt, wanted, kept, captured, reused) -> SpanRows:
        missing = self.cache.missing(wanted, prompt)
        t0, net0 = time.perf_counter(), self.profile.net_mark()
        rows = self.scoring.query_rows(prompt, missing)
        if missing:
            ms, net = (time.perf_counter() - t0) * 1e3, self.profile.net_mark() - net0
            self.profile.add(TransferPath.SCORING_DECODE, ms, calls=len(missing), net_bytes=net)
        return rows


def query_source(
    capture: QueryCapture | None,
    scoring: ScoringContext | None,
    rows: QueryRows,
    cache: QueryCache,
    config: KVMemConfig,
    profile: TransferProfile,
) -> QuerySource:
    """The source for a session: none with KVMem off or nothing to capture."""
    if not config.enabled:
        return NoSource()
    if scoring is not None:
        return ScoringSource(scoring, cache, profile)
    if capture is not None:
        return MainSource(capture, rows, config)
    return NoSource()
