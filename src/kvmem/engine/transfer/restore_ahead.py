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
class ReadyBlob:
    """Restore blobs built ahead, one per piece of the restore (`KVTransfer._fitting`)."""

    pieces: list[list[BlockKV]]  # ascending block ids, piece after piece
    blobs: list[np.ndarray]  # uint8 [n_bytes] per piece, views of RestoreAhead's buffer
    build_ms: float  # on the builder's thread, beside the prefill
    versions: tuple[int, ...]  # the store's version of each block when the build started
    wait_ms: float = 0.0  # what the restore waited for the build

    @property
    def block_ids(self) -> tuple[int, ...]:
        return tuple(b.block_id for piece in self.pieces for b in piece)

    @property
    def nbytes(self) -> int:
        return sum(len(blob) for blob in self.blobs)


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
        self._job: Future[ReadyBlob] | None = None
        self._ids: tuple[int, ...] = ()  # the blocks of the build

    def start(
        self,
        layout: StateLayout,
        pieces: Sequence[Sequence[BlockKV]],
        versions: Sequence[int],
    ) -> bool:
        """Build the blob of every piece on the builder's thread (`versions`: the store's
        version of each block, in order); False (nothing started) when there is nothing to
        build or they do not fit the buffer's limit together."""
        self.drop()
        sizes = [8 + kv_part_nbytes(layout, sum(b.n_tokens for b in p)) for p in pieces]
        if not pieces or sum(sizes) > self.buffer.limit_bytes:
            return False
        job = [list(p) for p in pieces]
        self._job = self._worker.submit(self._build, layout, job, sizes, tuple(versions))
        self._ids = tuple(b.block_id for p in pieces for b in p)
        return True

    def _build(
        self,
        layout: StateLayout,
        pieces: list[list[BlockKV]],
        sizes: list[int],
        versions: tuple[int, ...],
    ) -> ReadyBlob:
        t0 = time.perf_counter()
        buf = self.buffer.view(sum(sizes))  # uint8 [sum(sizes)]
        ends = np.cumsum(sizes)  # [n_pieces]
        blobs = [
            build_state(layout, p, RESTORE_SEQ, buf[e - n : e], native=self.native)
            for p, n, e in zip(pieces, sizes, ends.tolist(), strict=True)
        ]
        return ReadyBlob(pieces, blobs, (time.perf_counter() - t0) * 1e3, versions)

    def take(self, wanted: Sequence[int]) -> ReadyBlob | None:
        """The blobs, once built, if they hold exactly the blocks `wanted` (ascending),
        which uses them up; else None, at once (another restore: they wait for theirs). A
        build that failed is logged and gone."""
        job = self._job
        if job is None or self._ids != tuple(wanted):
            return None
        self._job, self._ids = None, ()
        t0 = time.perf_counter()
        try:
            ready = job.result()
        except Exception as e:  # the restore builds these blocks itself
            logger.warning("restore blob built ahead failed: %s", e)
            return None
        ready.wait_ms = (time.perf_counter() - t0) * 1e3
        return ready

    def drop(self) -> None:
        """Forget the blob (after its build: the buffer is reused)."""
        job, self._job, self._ids = self._job, None, ()
        if job is not None:
            wait([job])

    def close(self) -> None:
        self.drop()
        self._worker.shutdown(wait=True)
        self.buffer.close()
