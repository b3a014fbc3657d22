"""Block blobs of a hybrid memory (attention layers + recurrent layers) for KVTransfer.

On a hybrid memory (qwen35: gated-delta-net layers with attention every few layers) only
the attention cells are KVMem blocks. A staging sequence's blob carries a recurrent part
too, and `seq_cp(staging -> main)` hands the staging sequence's recurrent state to the main
sequence (BRIEF §4, the seq_cp pitfall). So:

- harvest parses the hybrid blob with the codec (unknown layouts are refused with a
  StateFormatError) and keeps the attention part alone;
- restore builds the staging blob with the main sequence's own recurrent state (read back
  with PARTIAL_ONLY just before), so the copy into the main sequence leaves it unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from kvmem.memory.host_store import BlockKV

from ..llama.batch_rows import MAIN_SEQ
from ..llama.context import LlamaContext
from ..transfer.state_codec import SeqState, StateLayout
from .hybrid_codec import build_hybrid_state, parse_hybrid_state
from .recurrent_state import read_recurrent

logger = logging.getLogger(__name__)


class HybridBlobs:
    """Parse and build the staging blobs of one hybrid context."""

    def __init__(self, ctx: LlamaContext) -> None:
        self.ctx = ctx
        self.cell_ext = ctx.model.kv_cell_ext

    def parse(self, blob: bytes | memoryview) -> SeqState:
        """The attention part of a staging sequence's blob (its recurrent part is a copy of
        the main sequence's and is dropped)."""
        return parse_hybrid_state(blob, cell_ext=self.cell_ext).attn

    def build(self, layout: StateLayout, blocks: Sequence[BlockKV], seq_id: int) -> np.ndarray:
        """A staging blob of `blocks` whose recurrent part is the main sequence's as it is
        now: uint8 [n_bytes]."""
        recurrent = read_recurrent(self.ctx, MAIN_SEQ)
        return build_hybrid_state(layout, blocks, seq_id, recurrent)


def hybrid_blobs(ctx: LlamaContext) -> HybridBlobs | None:
    """The hybrid blob handler when the context's memory is hybrid, else None (an MTP
    draft context of a hybrid model has a plain attention cache: mtp_draft.py)."""
    return HybridBlobs(ctx) if ctx.model.is_hybrid and not ctx.settings.draft_mtp else None
