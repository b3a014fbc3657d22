"""ReplaySSM: the recurrent state of a hybrid session at the points it may go back to.

A hybrid memory's recurrent state has folded in every token and cannot drop a tail by
itself (`seq_rm` of a range holding its tail fails without rollback planes), so every cut
of the history goes back to a snapshot first (recurrent_state.RecurrentCheckpoints):

- query replay: before the first pass over the live tail, the prefill stops at the query
  boundary (the earliest position a replay may start from: max(live start, n - pinned
  query tokens, 1)) and at the block boundaries after it, and snapshots the state there
  (PARTIAL_ONLY). A replay restores the snapshot at its start and re-processes the tail
  against the new window, so the replayed pass sees the state of a pass that never
  processed the query. Snapshots after the replay start are stale and dropped.
- truncation (a turn that diverges inside the history, the frontier): the history is cut
  back to the latest snapshot at or before the cut and the tokens from there are
  re-processed with the new suffix (the documented fallback; with no snapshot, the start).
  The session snapshots at the end of each prefill and of each turn, so the common cases
  (frontier at the prompt's end, a new turn after the last one) cost no re-processing.

Snapshots are bounded (`max_snapshots`, the oldest goes first); a replay whose snapshot
went replays from the latest earlier one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from kvmem.memory.spans import PromptSpans

from ..llama.context import LlamaContext
from .recurrent_state import RecurrentCheckpoints, restore_recurrent

logger = logging.getLogger(__name__)

MAX_SNAPSHOTS = 8
MAX_PREFILL_POINTS = 4  # snapshot stops per prefill: the query boundary + block boundaries


@dataclass(slots=True)
class ReplaySSMStats:
    snapshots: int = 0
    restores: int = 0
    fallbacks: int = 0  # cuts that went back further than asked (re-processed tokens)


class ReplaySSM:
    """Recurrent snapshots of the main sequence of a hybrid session (see the module doc)."""

    active = True  # the session's recurrent hook (recurrent_hook.py)

    def __init__(self, ctx: LlamaContext, max_snapshots: int = MAX_SNAPSHOTS) -> None:
        self.ctx = ctx
        self.checkpoints = RecurrentCheckpoints(max_snapshots)
        self.stats = ReplaySSMStats()
        self._points: list[int] = []  # boundaries p (tokens [0, p) folded in) to stop at

    # prefill --------------------------------------------------------------------------
    def plan_prefill(
        self, start: int, n: int, spans: PromptSpans, pin_tokens: int, block_tokens: int
    ) -> list[int]:
        """Boundaries in (start, n) where this prefill stops to snapshot: every position a
        query replay may start from (window._replay_start: the query boundary, or a block
        boundary after it)."""
        live = spans.live.start if spans.live is not None else 0
        first = max(live, n - pin_tokens, 1)
        up = -(-first // block_tokens) * block_tokens
        points = [first, *range(up, n, block_tokens)]
        self._points = sorted({p for p in points if start < p < n})[:MAX_PREFILL_POINTS]
        return list(self._points)

    def chunk_size(self, pos: int, size: int) -> int:
        """Shorten a prefill chunk [pos, pos + size) to end at the next snapshot point."""
        for p in self._points:
            if pos < p < pos + size:
                return p - pos
        return size

    def after_decode(self, end: int) -> None:
        """Tokens [0, end) are folded in: snapshot when `end` is a planned point."""
        if end in self._points:
            self.take()

    def end_prefill(self) -> None:
        self._points = []
        self.take()

    def take(self) -> None:
        self.checkpoints.take(self.ctx)
        self.stats.snapshots += 1

    # going back -------------------------------------------------------------------------
    def rewind_to(self, start: int) -> int:
        """Put back the state of the latest snapshot with boundary <= `start` (tokens
        [0, boundary) folded in) and return that boundary (0: nothing kept; the caller's
        seq_rm from 0 clears the state). The caller then cuts the history at the
        boundary and re-processes from there."""
        self.checkpoints.forget_from(start)
        snap = self.checkpoints.latest
        boundary = snap.pos + 1 if snap is not None else 0
        if snap is not None:
            restore_recurrent(self.ctx, snap)
            self.stats.restores += 1
        if boundary != start:
            self.stats.fallbacks += 1
            logger.info(
                "recurrent state: no snapshot at %d, re-processing from %d", start, boundary
            )
        return boundary

    def clear(self) -> None:
        self.checkpoints.forget_from(0)
        self._points = []
