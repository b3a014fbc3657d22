"""The session's side of the spec step's decode interface (`spec.decode_target`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvmem.memory.block_table import BlockTable

from ..llama.context import LlamaContext
from ..trace import TurnStats
from .window import GpuWindow


@dataclass(slots=True)
class SpecTarget:
    """The block table, window and context of one session, as `DecodeTarget`."""

    ctx: LlamaContext
    n_ctx: int
    table: BlockTable
    window: GpuWindow
    bounded: bool  # KVMem on: the window's reserve bounds the drafts

    @property
    def n_tokens(self) -> int:
        return self.table.n_tokens

    def history(self) -> np.ndarray:
        return self.table.token_array()

    def draft_room(self, stats: TurnStats, gen_start: int) -> int | None:
        if not self.bounded:
            return None
        stats.add(self.window.ensure_room(1, gen_start))
        return self.window.capacity - self.window.cells_used() - 1

    def note_decode(self) -> None:
        self.window.note_decode()

    def accept(self, tokens: list[int], stats: TurnStats) -> None:
        stats.add(self.window.append(tokens))
