"""Retrieved blocks computed again inside the chosen window (`--kvmem-recompute`).

The prefill stream computes a block's KV beside the text around it in the history. A
reselection then lays the retrieved blocks next to blocks they never saw. Decoding each
one again at its place in the window, lowest first, gives it the KV that a short prompt
of the window's text would have: the block sees the window's blocks before it, as
compact-rag's re-prefilled chunks see theirs (CacheBlend recomputes a selection of tokens
for the same reason). The decode runs on the restore staging sequence, which first joins
the main sequence's cells below the block (`seq_cp`, no copy): llama.cpp asks a sequence's
new positions to follow its last one, which the main sequence's tail does not. The main
sequence then gives up the block's old cells for the new ones.

The host copy keeps the stream's KV: the history does not change, only the window's view
of it, and a block staged out and in again is computed again at the next reselection.
"""

from __future__ import annotations

import time
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
class RecomputePlan:
    """The blocks to decode again, in the order of their first positions."""

    blocks: tuple[int, ...] = ()
    starts: tuple[int, ...] = ()  # each block's first position in the window
    skipped: tuple[int, ...] = ()  # retrieved blocks that hold image rows: kept as they are


NOTHING = RecomputePlan()


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

    def __init__(self, ctx: LlamaContext, table: BlockTable, tracer: Tracer) -> None:
        self.ctx = ctx
        self.table = table
        self.tracer = tracer

    def plan(self, res: Reselection) -> RecomputePlan:
        """The retrieved tier's blocks by position (pure). A block with image rows is left
        as it is: its rows are embeddings the token batch cannot carry."""
        if res.plan.fits:
            return NOTHING
        bt = self.table.block_tokens
        tokens = self.table.tokens
        chosen = sorted(res.plan.retrieved, key=lambda b: res.starts[b])
        images = tuple(b for b in chosen if has_standins(tokens[b * bt : (b + 1) * bt]))
        kept = [b for b in chosen if b not in images]
        return RecomputePlan(tuple(kept), tuple(res.starts[b] for b in kept), images)

    def apply(self, plan: RecomputePlan) -> Moves:
        if not plan.blocks and not plan.skipped:
            return Moves()
        t0 = time.perf_counter()
        bt, ctx = self.table.block_tokens, self.ctx
        for block, start in zip(plan.blocks, plan.starts, strict=True):
            tokens = list(self.table.tokens[block * bt : (block + 1) * bt])
            ctx.seq_cp(MAIN_SEQ, RESTORE_SEQ, 0, start)
            ctx.decode_scratch(RESTORE_SEQ, tokens, start)
            ctx.seq_rm(MAIN_SEQ, start, start + bt)
            ctx.seq_cp(RESTORE_SEQ, MAIN_SEQ, start, start + bt)
            ctx.seq_rm(RESTORE_SEQ, -1, -1)
        ms = (time.perf_counter() - t0) * 1e3
        n = len(plan.blocks) * bt
        self.tracer.emit(
            TraceKind.RECOMPUTE,
            blocks=",".join(map(str, plan.blocks)) or "-",
            tokens=n,
            skipped=",".join(map(str, plan.skipped)) or "-",
            ms=ms,
        )
        return Moves(recomputed_tokens=n, recompute_ms=ms)


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
    return RecomputeRetrieved(ctx, table, tracer)
