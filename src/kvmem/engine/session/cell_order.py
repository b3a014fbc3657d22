"""The cells a turn starts on (`--kvmem-cell-order`), and the restore built ahead for it.

llama.cpp puts decoded and restored cells in the first free cells from its head, and
attention sums over cells in index order, so the cells a session holds depend on its
history. `FreeOrder` lets them: the next turn's first prefill chunk stages in the stream
blocks the last reselection left out, and that restore is built ahead. `FreshOrder`
(canonical) starts every turn on the cells a fresh prefill of its prompt holds where the
turn goes on (memory/kv_cells.py models them): the blocks already in those cells stay,
the rest is laid in one ordered restore, and that restore is the one built ahead.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

from kvmem.config import KVMemConfig
from kvmem.memory.kv_cells import KVCells
from kvmem.memory.spans import PromptSpans

from ..trace import Moves, TraceKind, Tracer
from .turn_plan import ChunkGrid
from .window import GpuWindow
from .window_plans import FreshPrefill, FreshRun, StreamAt, fresh_cells

logger = logging.getLogger(__name__)


class TurnCells(Protocol):
    """Where a turn's cells start, and what is built ahead for the next turn."""

    def start_turn(self, reused: int, spans: PromptSpans) -> Moves:
        """The history is cut to `reused`: lay the cells the turn goes on from."""
        ...

    def prepare_next(self, position: int, spans: PromptSpans) -> None:
        """Build the next turn's first restore ahead, for a turn going on from `position`."""
        ...


@dataclass(slots=True)
class FreeOrder:
    """Turns go on from the cells the session holds."""

    window: GpuWindow
    grid: ChunkGrid

    def start_turn(self, reused: int, spans: PromptSpans) -> Moves:
        return Moves()

    def prepare_next(self, position: int, spans: PromptSpans) -> None:
        room = self.window.capacity - self.grid.chunk_tokens
        self.window.prepare_next_stream(StreamAt(position, spans, room, self.grid.stream_grid))


@dataclass(slots=True)
class FreshOrder:
    """Turns start on a fresh prefill's cells (`--kvmem-cell-order canonical`)."""

    window: GpuWindow
    grid: ChunkGrid
    config: KVMemConfig
    tracer: Tracer
    _run: FreshRun | None = None  # the last fresh prefill modelled

    def fresh(self, spans: PromptSpans, position: int) -> KVCells | None:
        """The cells a fresh prefill of a prompt with `spans` holds at `position` (a chunk
        start); None where the model does not cover it. Goes on from the last run when
        its prefill is the same (the stream windows read the control text and the image
        groups alone), so a turn models only the chunks since the last."""
        g, ctx = self.grid, self.window.ctx
        room = self.window.capacity - g.chunk_tokens
        key = PromptSpans(control=spans.control, groups=spans.groups)
        fresh = FreshPrefill(key, room, g.chunk_tokens, g.stream_grid, ctx.n_ubatch, ctx.n_cells)
        run = fresh_cells(self.config, fresh, position, self._run)
        if run is None:
            return None
        self._run = run
        return run.cells.cells

    def order(self, spans: PromptSpans, position: int) -> list[int] | None:
        """The blocks of those cells in cell order (None: not modelled)."""
        cells = self.fresh(spans, position)
        return None if cells is None else cells.block_order(self.config.block_tokens)

    def start_turn(self, reused: int, spans: PromptSpans) -> Moves:
        order = self.order(spans, reused)
        if order is None:  # the turn goes on from the cells it holds, traced
            self.tracer.emit(TraceKind.CELLS_UNMODELLED, at=reused)
            logger.warning(
                "canonical cell order: no model of a fresh prefill's cells at %d", reused
            )
            return Moves()
        return self.window.apply_lay(self.window.plan_lay(order))

    def prepare_next(self, position: int, spans: PromptSpans) -> None:
        resume = self.grid.chunk_start(position)  # where the next turn goes on (turn_plan)
        order = self.order(spans, resume)
        if order is not None:
            self.window.prepare_next_lay(resume, order)


def turn_cells(
    window: GpuWindow, grid: ChunkGrid, config: KVMemConfig, tracer: Tracer
) -> TurnCells:
    """FreshOrder where `--kvmem-cell-order canonical` holds for this window
    (`GpuWindow.keeps_order`), else FreeOrder."""
    if window.keeps_order:
        return FreshOrder(window, grid, config, tracer)
    return FreeOrder(window, grid)
