"""Snapshots of a sequence's recurrent state on a hybrid memory (the ReplaySSM primitive).

`snapshot_recurrent` reads the recurrent part alone (LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
`restore_recurrent` writes it back, replacing the sequence's recurrent cell and leaving its
attention cells alone. `rewind` restores a snapshot and then removes the attention cells
after it, so the sequence is exactly what it was when the snapshot was taken (the order
matters: on the recurrent memory, `seq_rm` of a range that holds its tail fails unless the
context keeps rollback states, while after the restore the tail lies before the range).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import llama_cpp
import numpy as np

from kvmem.errors import KVTransferError

from ..llama.batch_rows import MAIN_SEQ
from ..llama.context import LlamaContext
from ..llama.host_staging import StagingBuffer
from .hybrid_codec import RecurrentState, parse_partial_state

logger = logging.getLogger(__name__)

PARTIAL_ONLY = llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY


@dataclass(slots=True)
class RecurrentSnapshot:
    """One sequence's recurrent state at a token boundary."""

    seq_id: int
    pos: int  # the last position folded into the state (-1: nothing yet)
    blob: np.ndarray  # uint8 [n_bytes]: the PARTIAL_ONLY blob, as llama.cpp wrote it

    @property
    def nbytes(self) -> int:
        return int(self.blob.nbytes)

    def parse(self) -> RecurrentState:
        return parse_partial_state(self.blob).recurrent


def read_recurrent(ctx: LlamaContext, seq: int = MAIN_SEQ) -> RecurrentState:
    """The sequence's recurrent state as it is now (parsed; for comparisons and tests)."""
    return parse_partial_state(ctx.get_state(seq, PARTIAL_ONLY)).recurrent


def snapshot_recurrent(
    ctx: LlamaContext, seq: int = MAIN_SEQ, staging: StagingBuffer | None = None
) -> RecurrentSnapshot:
    """Copy the sequence's recurrent state to the host (the blob is validated by parsing):
    into owned memory, or, with `staging`, into that reused (page-locked) buffer, and then
    the snapshot is valid only until the buffer's next use (a verification step's own)."""
    if not ctx.model.is_hybrid and not ctx.model.is_recurrent:
        raise KVTransferError("the model has no recurrent layers: nothing to snapshot")
    if staging is not None:
        blob = np.frombuffer(ctx.get_state(seq, PARTIAL_ONLY, staging), dtype=np.uint8)
    else:
        blob = np.array(ctx.get_state(seq, PARTIAL_ONLY), dtype=np.uint8)  # [n_bytes], owned
    state = parse_partial_state(blob).recurrent
    pos = int(state.positions.max()) if len(state.positions) else -1
    logger.debug("recurrent snapshot of seq %d at pos %d: %d bytes", seq, pos, blob.nbytes)
    return RecurrentSnapshot(seq_id=seq, pos=pos, blob=blob)


def restore_recurrent(
    ctx: LlamaContext, snapshot: RecurrentSnapshot, seq: int | None = None
) -> None:
    """Put the snapshot back as `seq`'s recurrent state (default: the sequence it was
    taken from); the attention cells are not touched."""
    ctx.set_state(snapshot.blob, snapshot.seq_id if seq is None else seq, PARTIAL_ONLY)


def rewind(ctx: LlamaContext, snapshot: RecurrentSnapshot, seq: int | None = None) -> None:
    """Return `seq` to the snapshot's boundary: recurrent state restored, then every
    attention cell after `snapshot.pos` removed."""
    target = snapshot.seq_id if seq is None else seq
    restore_recurrent(ctx, snapshot, target)
    ctx.seq_rm(target, snapshot.pos + 1, -1)


class RecurrentCheckpoints:
    """Bounded recurrent snapshots of one sequence at token boundaries (turn ends, query
    starts), for going back to a point inside the history: a new turn that diverges at
    `pos` continues from the latest snapshot before `pos` and re-decodes the history tokens
    from there (`resume`). With no usable snapshot the fallback is the start: the sequence
    is cleared and everything is re-decoded. When full, the oldest snapshot is dropped."""

    def __init__(self, max_snapshots: int = 4, seq: int = MAIN_SEQ) -> None:
        if max_snapshots < 1:
            raise ValueError(f"max_snapshots must be >= 1, got {max_snapshots}")
        self.max_snapshots = max_snapshots
        self.seq = seq
        self._snaps: list[RecurrentSnapshot] = []  # ascending pos

    @property
    def positions(self) -> list[int]:
        return [s.pos for s in self._snaps]

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self._snaps)

    @property
    def latest(self) -> RecurrentSnapshot | None:
        return self._snaps[-1] if self._snaps else None

    def take(self, ctx: LlamaContext) -> RecurrentSnapshot:
        """Snapshot the sequence as it is now (replacing one at the same position)."""
        snap = snapshot_recurrent(ctx, self.seq)
        self._snaps = [s for s in self._snaps if s.pos < snap.pos]  # later ones are stale
        self._snaps.append(snap)
        if len(self._snaps) > self.max_snapshots:
            self._snaps.pop(0)
        return snap

    def forget_from(self, pos: int) -> None:
        """Drop snapshots that include position `pos` or later (the history was cut there)."""
        self._snaps = [s for s in self._snaps if s.pos < pos]

    def resume(self, ctx: LlamaContext, keep: int) -> int:
        """Return the sequence to a state that has seen exactly tokens [0, start) for the
        largest snapshot boundary start <= keep; the caller re-decodes tokens [start, keep)
        of the history and then the new ones. Returns start (0: the fallback, a cleared
        sequence)."""
        self.forget_from(keep)
        if self._snaps:
            snap = self._snaps[-1]
            rewind(ctx, snap, self.seq)
            logger.debug("resumed seq %d at %d for a cut at %d", self.seq, snap.pos + 1, keep)
            return snap.pos + 1
        ctx.seq_rm(self.seq, -1, -1)
        logger.debug("no recurrent snapshot before %d: seq %d re-decodes from 0", keep, self.seq)
        return 0
