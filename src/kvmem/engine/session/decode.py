"""Decoding after the window is chosen (the deferred tail, a replay, generation, teacher
forcing): chunks of the session's chunk size, each after room is made for it.

`ChunkRunner` is the step every chunk takes, prefill's included (prefill.py): decode it on
the main context (the query capture armed when asked) and record it in the window.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import numpy as np

from kvmem.errors import TurnCancelledError
from kvmem.memory.block_table import BlockTable

from ..hybrid.recurrent_hook import RecurrentHook
from ..llama.context import LlamaContext
from ..query.query_capture import QueryCapture
from ..trace import TurnStats
from ..transfer.transfer_profile import TransferProfile
from .turn_plan import ChunkGrid
from .window import GpuWindow


class ChunkRunner:
    """One session's decode step: its context, block table, window and recurrent hook."""

    def __init__(
        self,
        ctx: LlamaContext,
        table: BlockTable,
        window: GpuWindow,
        capture: QueryCapture | None,
        recurrent: RecurrentHook,
        bounded: bool,  # KVMem on: chunks make room in the window first
        grid: ChunkGrid,
        profile: TransferProfile,
    ) -> None:
        self.ctx = ctx
        self.table = table
        self.window = window
        self.capture = capture
        self.recurrent = recurrent
        self.bounded = bounded
        self.grid = grid
        self.profile = profile
        self.cancel: threading.Event | None = None  # checked before each prompt chunk

    def check_cancel(self) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise TurnCancelledError("the turn was cancelled during prompt processing")

    def run(
        self, chunk: list[int], pos: int, want_all: bool, last: bool, arm: bool
    ) -> dict[int, np.ndarray]:
        """Decode `chunk` at `pos`; the query rows captured (layer -> rows) when `arm`."""
        capture = self.capture if arm else None
        if capture is not None:
            capture.arm(len(chunk))
        try:
            flags = [want_all] * len(chunk)
            flags[-1] = flags[-1] or last
            self.ctx.decode(chunk, pos, flags)
        finally:
            got = capture.disarm() if capture is not None else {}
        return got

    def run_pieces(
        self,
        chunk: list[int],
        pos: int,
        last: bool,
        arm: bool,
        after: Callable[[list[int], bool], None],
    ) -> dict[int, np.ndarray]:
        """`run` (a prompt chunk, no logits but the last token's when `last`) in the
        ubatches llama.cpp splits it into anyway, with `after(piece, last_piece)` after
        each: each ubatch sees the same cells, so the logits and rows are the same bit for
        bit."""
        step = self.grid.ubatch if 0 < self.grid.ubatch < len(chunk) else len(chunk)
        parts: dict[int, list[np.ndarray]] = {}
        for p0 in range(0, len(chunk), step):
            piece, end = chunk[p0 : p0 + step], p0 + step >= len(chunk)
            got = self.run(piece, pos + p0, False, last and end, arm)
            for layer, rows in got.items():
                parts.setdefault(layer, []).append(rows)
            after(piece, end)
        return {layer: np.concatenate(rows) for layer, rows in parts.items()}

    def record(self, chunk: Sequence[int], stats: TurnStats, *, harvest: bool = True) -> None:
        stats.add(self.window.append(chunk, harvest=harvest))
        self.recurrent.after_decode(self.table.n_tokens)


def decode_tokens(
    runner: ChunkRunner,
    tokens: list[int],
    stats: TurnStats,
    *,
    gen_start: int | None = None,
    want_all_logits: bool = False,
) -> list[np.ndarray]:
    """Decode `tokens` after the history; the logits of every token when `want_all_logits`
    (else none). `gen_start`: where this generation started (its blocks spill first);
    None for the tail and replays, which can be cancelled between chunks."""
    rows: list[np.ndarray] = []
    size = runner.grid.chunk_tokens
    for c0 in range(0, len(tokens), size):
        pos = runner.table.n_tokens
        chunk = tokens[c0 : c0 + size]
        if gen_start is None:
            runner.check_cancel()
        if runner.bounded:
            stats.add(runner.window.ensure_room(len(chunk), gen_start))
        runner.window.note_decode()
        runner.run(chunk, pos, want_all_logits, c0 + len(chunk) == len(tokens), arm=False)
        if want_all_logits:
            rows += [runner.ctx.logits(i) for i in range(len(chunk))]
        runner.record(chunk, stats)
    return rows
