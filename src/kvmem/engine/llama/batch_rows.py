"""The sequence ids of a context, and the per-row fields every llama_batch of the main
sequence shares (token batches in context.py, embedding batches in media_prefill.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

MAIN_SEQ = 0  # the conversation
HARVEST_SEQ = 1  # staging sequence for reading blocks out
RESTORE_SEQ = 2  # staging sequence for writing blocks in
N_SEQ = 3


def fill_rows(
    raw: Any, n: int, start_pos: int, logits: Sequence[bool], seq: int = MAIN_SEQ
) -> None:
    """Positions start_pos.., the sequence (the main one unless told) and the logits flags
    of a batch's n rows."""
    raw.n_tokens = n
    for i in range(n):
        raw.pos[i] = start_pos + i
        raw.n_seq_id[i] = 1
        raw.seq_id[i][0] = seq
        raw.logits[i] = 1 if logits[i] else 0
