"""Retrieved blocks computed again inside the chosen window (`--kvmem-recompute`).

The prefill stream computes a block's KV beside the text around it in the history. A
reselection then lays the retrieved blocks next to blocks they never saw. Decoding each
one again at its place in the window, lowest first, gives it the KV that a short prompt
of the window's text would have: the block sees the window's blocks before it, as
compact-rag's re-prefilled chunks see theirs (CacheBlend recomputes a selection of tokens
for the same reason). Retrieved blocks next to each other in the window form a run,
decoded as one batch (at most n_batch tokens a call): a token of the run sees the run's
tokens before it, as it would block by block. The decode runs on the restore staging
sequence, which first joins the main sequence's cells below the run (`seq_cp`, no copy):
llama.cpp asks a sequence's new positions to follow its last one, which the main
sequence's tail does not. The main sequence gives up the run's old cells before the
decode (so the run needs no free cells of its own) and takes the new ones after it.

The host copy keeps the stream's KV: the history does not change, only the window's view
of it, and a block staged out and in again is computed again at the next reselection.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from kvmem.config import KVMemConfig, RecomputeMode
from kvmem.errors import ConfigError
from kvmem.memory.block_table import BlockTable

from ..llama.batch_rows import MAIN_SEQ, RESTORE_SEQ
from ..llama.context import LlamaContext
from ..media.media_prefill import has_standins
from ..trace import Moves, TraceKind, Tracer
from .reselection import Reselection


@dataclass(frozen=True, slots=True)
class RecomputeRun:
    """Retrieved blocks at consecutive places in the window, decoded as one batch."""

    start: int  # the first block's first position in the window
    blocks: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class RecomputePlan:
    """The runs to decode again, in the order of their positions."""

    runs: tuple[RecomputeRun, ...] = ()
    skipped: tuple[int, ...] = ()  # retrieved blocks that hold image rows: kept as they are

    @property
    def blocks(self) -> tuple[int, ...]:
        return tuple(b for run in self.runs for b in run.blocks)


NOTHING = RecomputePlan()


def runs_of(
    blocks: Sequence[int], starts: Sequence[int], block_tokens: int
) -> tuple[RecomputeRun, ...]:
    """`blocks` (by position; `starts` their first positions) cut where one does not begin
    at the end of the one before it."""
    runs: list[RecomputeRun] = []
    for block, start in zip(blocks, starts, strict=True):
        last = runs[-1] if runs else None
        if last is not None and last.start + len(last.blocks) * block_tokens == start:
            runs[-1] = RecomputeRun(last.start, (*last.blocks, block))
        else:
            runs.append(RecomputeRun(start, (block,)))
    return tuple(runs)


class WindowRecompute(Protocol):
    """What a reselection does to its retrieved blocks' KV once the window is applied."""

    def plan(self, res: Reselection) -> RecomputePlan: ...

    def apply(self, plan: RecomputePlan) -> Moves: ...


class KeepStreamKV:
    """`--kvmem-recompute off`: the retrieved blocks keep the stream's KV."""

    def plan(self, res: Reselection) -> RecomputePlan:
        return NOTHING

    def apply(self, plan: RecomputePlan) -> Moves:
        return Moves()


class RecomputeRetrieved:
    """`--kvmem-recompute retrieved`: every retrieved block decoded again in the window."""

    def __init__(
        self, ctx: LlamaContext, table: BlockTable, tracer: Tracer, min_history: int = 0
    ) -> None:
        self.ctx = ctx
        self.table = table
        self.tracer = tracer
        self.min_history = min_history  # tokens; a shorter history keeps the stream's KV

    def plan(self, res: Reselection) -> RecomputePlan:
        """The retrieved tier's blocks by position (pure). A block with image rows is left
        as it is: its rows are embeddings the token batch cannot carry."""
        if res.plan.fits or self.table.n_tokens <= self.min_history:
            return NOTHING
        bt = self.table.block_tokens
        tokens = self.table.tokens
        chosen = sorted(res.plan.retrieved, key=lambda b: res.starts[b])
        images = tuple(b for b in chosen if has_standins(tokens[b * bt : (b + 1) * bt]))
        kept = [b for b in chosen if b not in images]
        return RecomputePlan(runs_of(kept, [res.starts[b] for b in kept], bt), images)

    def apply(self, plan: RecomputePlan) -> Moves:
        if not plan.blocks and not plan.skipped:
            return Moves()
        t0 = time.perf_counter()
        for run in plan.runs:
            self._decode_run(run)
        ms = (time.perf_counter() - t0) * 1e3
        n = len(plan.blocks) * self.table.block_tokens
        self.tracer.emit(
            TraceKind.RECOMPUTE,
            blocks=",".join(map(str, plan.blocks)) or "-",
            runs=len(plan.runs),
            tokens=n,
            skipped=",".join(map(str, plan.skipped)) or "-",
            ms=ms,
        )
        return Moves(recomputed_tokens=n, recompute_ms=ms)

    def _decode_run(self, run: RecomputeRun) -> None:
        bt, ctx = self.table.block_tokens, self.ctx
        tokens = [t for b in run.blocks for t in self.table.tokens[b * bt : (b + 1) * bt]]
        start, end = run.start, run.start + len(tokens)
        ctx.seq_cp(MAIN_SEQ, RESTORE_SEQ, 0, start)
        ctx.seq_rm(MAIN_SEQ, start, end)
        for at in range(0, len(tokens), ctx.n_batch):
            ctx.decode_scratch(RESTORE_SEQ, tokens[at : at + ctx.n_batch], start + at)
        ctx.seq_cp(RESTORE_SEQ, MAIN_SEQ, start, end)
        ctx.seq_rm(RESTORE_SEQ, -1, -1)


def window_recompute(
    config: KVMemConfig, ctx: LlamaContext, table: BlockTable, tracer: Tracer
) -> WindowRecompute:
    """The session's WindowRecompute; refuses what it cannot do on this context."""
    if config.recompute is RecomputeMode.OFF or not config.enabled:
        return KeepStreamKV()
    if ctx.model.is_hybrid:
        raise ConfigError(
            "--kvmem-recompute", "not on a hybrid model (its recurrent state is not a block's)"
        )
    if not ctx.can_shift:
        raise ConfigError(
            "--kvmem-recompute",
            "this model's cache cannot shift positions, which --kvmem-positions compact needs",
        )
    if ctx.observer is not None:
        raise ConfigError("--kvmem-recompute", "not with --spec-type draft-mtp")
    min_history = int(config.recompute_above * config.budget)
    return RecomputeRetrieved(ctx, table, tracer, min_history)
