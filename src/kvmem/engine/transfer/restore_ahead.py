"""A restore blob built ahead, beside the prefill (data movement only).

With the query work ahead (query_ahead.py) a plan's scores are known while the last chunks
of the prompt still prefill, and so are the host blocks it will stage in. Building their
restore blob was most of a restore: on the H200 (session 10) 163 of 279 ms a round went to
host copies at 10.5 GB/s, 56 ms to `llama_state_seq_set_data` from pinned memory.
`RestoreAhead` builds that blob on a thread of its own into a buffer of its own (pinned on a
GPU; the staging buffer serves the harvests that go on meanwhile), piece by piece as the
restore would. The restore uses them when it stages in exactly those blocks, and otherwise
builds its own: a blob is a function of its blocks alone (`state_codec.build_state`), so
what the GPU receives, and where its cells go, do not depend on whether the build ran
ahead, nor on how early.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

import numpy as np

from kvmem.memory.host_store import BlockKV

from ..llama.batch_rows import RESTORE_SEQ
from ..llama.host_staging import HostAllocator, StagingBuffer
from .kv_copy import NativeCopy
from .state_codec import StateLayout, build_state, kv_part_nbytes

logger = logging.getLogger(__name__)

# the most built ahead: a whole 32K-token window of the 8B shape (q8_0 KV) is 2.3 GB; the
# buffer grows only as far as a restore needs (a larger one is built when it runs)
AHEAD_BYTES = 3 << 30


@dataclass(slots=True)
class BuiltPiece:
    """One piece's blob, built on the builder's thread."""

    blob: np.ndarray  # uint8 [n_bytes], a view of RestoreAhead's buffer
    build_ms: float


@dataclass(slots=True)
class ReadyBlob:
    """Restore blobs built ahead, one per piece of the restore (`KVTransfer._restore_ranges`),
    each on its own job: the restore sends a piece as soon as it is built, while the
    builder goes on with the next."""

    pieces: list[list[BlockKV]]  # the restore's blocks in its order, piece after piece
    jobs: list[Future[BuiltPiece]]  # one per piece, run in order
    versions: tuple[int, ...]  # the store's version of each block when the build started
    build_ms: float = 0.0  # of the pieces received, on the builder's thread
    wait_ms: float = 0.0  # what the restore waited for them
    nbytes: int = 0  # of the pieces received

    @property
    def block_ids(self) -> tuple[int, ...]:
        return tuple(b.block_id for piece in self.pieces for b in piece)

    def piece(self, i: int) -> np.ndarray | None:
        """Piece `i`'s blob once built (the wait counted), or None if its build failed
        (logged: the restore builds that piece itself)."""
        t0 = time.perf_counter()
        try:
            built = self.jobs[i].result()
        except Exception as e:
            logger.warning("restore blob built ahead failed: %s", e)
            return None
        finally:
            self.wait_ms += (time.perf_counter() - t0) * 1e3
        self.build_ms += built.build_ms
        self.nbytes += len(built.blob)
        return built.blob


class RestoreAhead:
    """At most one build at a time: `start` replaces it, `take` (by a restore of exactly
    its blocks) and `drop` use it up. So a restore's cells are the same whether or not
    its blobs were built ahead."""

    def __init__(
        self,
        allocator: HostAllocator | None,
        native: NativeCopy | None,
        limit_bytes: int = AHEAD_BYTES,
    ) -> None:
        self.buffer = StagingBuffer(allocator, limit_bytes)
        self.native = native
        self._worker = ThreadPoolExecutor(1, "kvmem-restore-ahead")
        self._ready: ReadyBlob | None = None

    def start(
        self,
        layout: StateLayout,
        pieces: Sequence[Sequence[BlockKV]],
        versions: Sequence[int],
    ) -> bool:
        """Build the blob of every piece on the builder's thread, one job each, in order
        (`versions`: the store's version of each block, in order); False (nothing started)
        when there is nothing to build or they do not fit the buffer's limit together."""
        self.drop()
        sizes = [8 + kv_part_nbytes(layout, sum(b.n_tokens for b in p)) for p in pieces]
        if not pieces or sum(sizes) > self.buffer.limit_bytes:
            return False
        buf = self._worker.submit(self.buffer.view, sum(sizes))  # uint8 [sum(sizes)]
        ends = np.cumsum(sizes).tolist()  # [n_pieces]
        jobs = [
            self._worker.submit(self._build, layout, list(p), buf, e - n, e)
            for p, n, e in zip(pieces, sizes, ends, strict=True)
        ]
        self._ready = ReadyBlob([list(p) for p in pieces], jobs, tuple(versions))
        return True

    def _build(
        self, layout: StateLayout, piece: list[BlockKV], buf: Future[np.ndarray], lo: int, hi: int
    ) -> BuiltPiece:
        t0 = time.perf_counter()
        out = buf.result()[lo:hi]  # uint8 [hi - lo]: the buffer, grown by the job before
        blob = build_state(layout, piece, RESTORE_SEQ, out, native=self.native)
        return BuiltPiece(blob, (time.perf_counter() - t0) * 1e3)

    @property
    def building(self) -> tuple[int, ...]:
        """The blocks of the build in hand, in the restore's order (empty: none)."""
        return () if self._ready is None else self._ready.block_ids

    def holds(self, wanted: Sequence[int], versions: Sequence[int]) -> bool:
        """Whether the build in hand is of exactly the blocks `wanted` (in order) at the
        store's `versions` (a second prediction of the same restore keeps it going)."""
        ready = self._ready
        if ready is None:
            return False
        return ready.block_ids == tuple(wanted) and ready.versions == tuple(versions)

    def take(self, wanted: Sequence[int]) -> ReadyBlob | None:
        """The build, if it holds exactly the blocks `wanted` (in order), which uses it up
        (its pieces are waited for one by one, `ReadyBlob.piece`); else None, at once
        (another restore: it waits for its own)."""
        ready = self._ready
        if ready is None or ready.block_ids != tuple(wanted):
            return None
        self._ready = None
        return ready

    def drop(self) -> None:
        """Forget the blob (after its build: the buffer is reused)."""
        ready, self._ready = self._ready, None
        if ready is not None:
            wait(ready.jobs)

    def close(self) -> None:
        self.drop()
        self._worker.shutdown(wait=True)
        self.buffer.close()
