"""Moving blocks between the llama.cpp context and the host store (data movement only).

Policy (which blocks move) lives in kvmem.memory.planner and the window; this module
only performs the moves, batching every call: one state read for all the blocks
harvested together (in pieces whose blob fits the staging buffer), a few state writes for
the blocks restored together (those pieces, each cut in up to `RESTORE_PIECES`). It never
writes residency: the window (the one owner of where blocks are) records what it did.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from kvmem.engine_settings import STAGING_BYTES
from kvmem.errors import KVTransferError
from kvmem.memory.block_table import BlockTable, block_runs
from kvmem.memory.host_store import BlockKV, HostStore
from kvmem.memory.layout import BlockMove, move_order
from kvmem.memory.retrieval_index import BlockKeys, RetrievalIndex

from ..hybrid.hybrid_transfer import hybrid_blobs
from ..llama.batch_rows import HARVEST_SEQ, MAIN_SEQ, RESTORE_SEQ
from ..llama.context import LlamaContext
from ..llama.host_staging import StagingBuffer
from ..llama.llama_lib import host_buffer_allocator
from .block_buffers import BlockBuffers, shared_buffers, take_buffer
from .harvest_split import owned_block, split_owned
from .kv_copy import CopyPlan, NativeCopy, copy_threads, native_copy
from .restore_ahead import ReadyBlob, RestoreAhead
from .state_codec import StateLayout, build_state, kv_part_nbytes, parse_state, split_blocks
from .transfer_profile import TransferPath, TransferProfile

logger = logging.getLogger(__name__)

# a restore goes in up to this many pieces within each that fits the staging buffer: a blob
# built ahead is sent piece by piece while the builder builds the next (each piece is one
# `llama_state_seq_set_data`: 2 x n_layer tensor writes)
RESTORE_PIECES = 4


@dataclass(slots=True)
class TransferResult:
    blocks: int
    bytes: int
    ms: float
    block_ids: tuple[int, ...] = ()
    built_ahead: int = 0  # restored blocks whose blob was built beside the prefill


class KVTransfer:
    """Harvest, restore, move and evict blocks of the main sequence.

    Callers say where a block's cells are (`starts`: block id -> first position) when
    they are not at the block's own positions.
    """

    def __init__(
        self,
        ctx: LlamaContext,
        table: BlockTable,
        store: HostStore,
        index: RetrievalIndex | None,
        staging_bytes: int = STAGING_BYTES,
    ) -> None:
        self.ctx = ctx
        self.table = table
        self.store = store
        self.index = index
        self.layout: StateLayout | None = None
        self.profile = TransferProfile()
        # None: every blob in fresh memory, one state call per transfer (the plain path)
        self.staging: StagingBuffer | None = (
            StagingBuffer(host_buffer_allocator(), staging_bytes) if staging_bytes > 0 else None
        )
        self.hybrid = hybrid_blobs(ctx)  # hybrid memory: attention blocks only (hybrid_transfer)
        self.cell_ext = ctx.model.kv_cell_ext  # M-RoPE cells (an MTP draft context's)
        # the staged path copies on copy_threads() threads into buffers touched ahead
        staged, threads = self.staging is not None, copy_threads()
        # pages touched ahead only where the copy-out runs beside the GPU (copy threads)
        self.buffers: BlockBuffers | None = shared_buffers() if staged and threads > 1 else None
        self.copier = ThreadPoolExecutor(threads, "kvmem-copy") if staged and threads > 1 else None
        # the copy-out and the restore blob in one native call each (None: numpy, kv_copy)
        self.native: NativeCopy | None = native_copy(threads)
        self._pending: list[Future[tuple[list[BlockKV], float]]] = []  # copy-outs running
        self._pending_ids: set[int] = set()
        # the next restore's blobs, built beside the prefill (`prepare`)
        self.ahead: RestoreAhead | None = (
            RestoreAhead(host_buffer_allocator(), self.native)
            if self.staging is not None and self.hybrid is None
            else None
        )

    def harvest(self, block_ids: Sequence[int]) -> TransferResult:
        """Copy complete, GPU-resident blocks to the host store (replacing older copies).

        With copy threads, the blocks' copy-out from the staging buffer runs while the
        caller goes on (the next prefill chunk computes on the GPU meanwhile); `flush` puts
        them into the store, and every use of the store or the staging buffer flushes first.
        """
        if not block_ids:
            return TransferResult(0, 0, 0.0)
        bt = self.table.block_tokens
        ids = list(block_ids)
        got: list[TransferResult] = []
        if self.layout is None and self.staging is not None and self.hybrid is None:
            got.append(self._harvest_piece(ids[:1]))  # its blob's layout sizes the pieces
            ids = ids[1:]
        got += [self._harvest_piece(ids[r.start : r.stop]) for r in self._fitting([bt] * len(ids))]
        return TransferResult(
            sum(g.blocks for g in got),
            sum(g.bytes for g in got),
            sum(g.ms for g in got),
            tuple(b for g in got for b in g.block_ids),
        )

    def _harvest_piece(self, block_ids: Sequence[int]) -> TransferResult:
        """One state read of `block_ids` (a blob that fits the staging buffer)."""
        self.flush()  # the staging buffer is about to be reused
        t0 = time.perf_counter()
        bt = self.table.block_tokens
        prof = self.profile
        runs = block_runs(block_ids)
        with prof.timed(TransferPath.SEQ_CP, calls=len(runs)):
            for run in runs:
                self.ctx.seq_cp(MAIN_SEQ, HARVEST_SEQ, run.start * bt, run.stop * bt)
        try:
            t_get, grow, net0 = time.perf_counter(), self._grow_mark(), prof.net_mark()
            blob = self.ctx.get_state(HARVEST_SEQ, staging=self.staging)
            ms, net = (time.perf_counter() - t_get) * 1e3, prof.net_mark() - net0
            prof.add(TransferPath.STATE_GET, ms, len(blob), net_bytes=net)
            self._note_grow(grow)
        finally:
            with prof.timed(TransferPath.SEQ_RM):
                self.ctx.seq_rm(HARVEST_SEQ, -1, -1)
        native = self.native
        plan = native.plan() if native is not None else None
        with prof.timed(TransferPath.STATE_SPLIT, len(blob)):
            if self.hybrid is not None:
                state = self.hybrid.parse(blob)
            else:
                state = parse_state(blob, cell_ext=self.cell_ext, transpose_v=plan is None)
            if plan is not None:  # blocks in their own buffers, filled when the plan runs
                views = split_owned(state, bt, self._take, plan)
            else:
                views = split_blocks(state, bt)  # views of the staging buffer
        if sorted(b.block_id for b in views) != sorted(block_ids):
            raise KVTransferError(f"harvest of blocks {list(block_ids)} returned other cells")
        if any(len(b.positions) != bt for b in views):
            raise KVTransferError("harvested a block that is not complete on the GPU")
        self.layout = self.layout or state.layout
        n_bytes = sum(block.nbytes for block in views)
        # own copies: the blob lives in the staging buffer, reused by the next transfer
        if plan is not None and self.copier is None:
            copy_ms = plan.run()
            prof.add(TransferPath.COPY_WAIT, copy_ms)
            self._put(views, copy_ms)
        elif plan is not None:  # one native call on a copy thread (it releases the GIL)
            # the blob stays referenced until the copy ran (it is fresh memory, not the
            # staging buffer's, when it did not fit)
            self._pending = [self.copier.submit(self._ran, plan, views, blob)]
            self._pending_ids = {b.block_id for b in views}
        elif self.copier is None:
            owned, copy_ms = self._copied(views)
            prof.add(TransferPath.COPY_WAIT, copy_ms)  # on this thread: all of it waited for
            self._put(owned, copy_ms)
        else:
            self._pending = [self.copier.submit(self._copied, [b]) for b in views]
            self._pending_ids = {b.block_id for b in views}
        ids = tuple(b.block_id for b in views)
        self.ctx.blocks_harvested(ids, bt)
        return TransferResult(len(views), n_bytes, (time.perf_counter() - t0) * 1e3, ids)

    def _copied(self, blocks: list[BlockKV]) -> tuple[list[BlockKV], float]:
        """Own copies of `blocks` (into buffers touched ahead), and the ms it took."""
        t0 = time.perf_counter()
        owned = [owned_block(b, self.buffers) for b in blocks]
        return owned, (time.perf_counter() - t0) * 1e3

    def _grow_mark(self) -> tuple[float, int]:
        staging = self.staging
        return (staging.grow_ms, staging.grown_bytes) if staging is not None else (0.0, 0)

    def _note_grow(self, mark: tuple[float, int]) -> None:
        """Record a staging-buffer growth since `mark` (a _grow_mark) as STAGING_GROW."""
        ms, n_bytes = self._grow_mark()
        if n_bytes > mark[1]:
            self.profile.add(TransferPath.STAGING_GROW, ms - mark[0], n_bytes - mark[1])

    def _take(self, n_bytes: int) -> np.ndarray:
        """uint8 [n_bytes] for a harvested block: touched ahead when there is a pool."""
        return take_buffer(self.buffers, n_bytes)

    @staticmethod
    def _ran(
        plan: CopyPlan, blocks: list[BlockKV], source: memoryview
    ) -> tuple[list[BlockKV], float]:
        """`blocks` once `plan` (their copy-out from `source`) has run, and the ms it took."""
        ms = plan.run()
        del source
        return blocks, ms

    def flush(self) -> None:
        """Put the blocks of copy-outs still running into the store (waiting for them)."""
        if not self._pending:
            return
        pending, self._pending, self._pending_ids = self._pending, [], set()
        with self.profile.timed(TransferPath.COPY_WAIT):
            done = [f.result() for f in pending]
        self._put([b for blocks, _ in done for b in blocks], sum(ms for _, ms in done))

    def _put(self, blocks: list[BlockKV], copy_ms: float) -> None:
        """Harvested blocks (own copies) into the host store and the retrieval index."""
        prof = self.profile
        n_bytes = sum(block.nbytes for block in blocks)
        prof.add(TransferPath.COPY_OUT, copy_ms, n_bytes, calls=len(blocks))
        with prof.timed(TransferPath.STORE_PUT, n_bytes, calls=len(blocks)):
            for block in blocks:
                self.store.put(block)
        if self.index is not None:
            with prof.timed(TransferPath.INDEX_ADD, calls=len(blocks)):
                self.index.add_blocks([BlockKeys(b.block_id, b.positions, b.k) for b in blocks])

    def restore(
        self,
        block_ids: Sequence[int],
        starts: Mapping[int, int] | None = None,
        *,
        ordered: bool = False,
    ) -> TransferResult:
        """Copy host blocks into the context, at `starts[b]` or else their own positions
        (with the blobs `prepare` built, when it built exactly these blocks'): their cells
        in ascending block order, or with `ordered` in the order given."""
        if not block_ids:
            return TransferResult(0, 0, 0.0)
        if self.layout is None:
            raise KVTransferError("restore before any harvest")
        self.flush()
        t0 = time.perf_counter()
        ids, starts = list(block_ids) if ordered else sorted(block_ids), starts or {}
        ready = self.ahead.take(ids) if self.ahead is not None else None
        if ready is not None and ready.versions != tuple(self.store.version(b) for b in ids):
            logger.debug("restore blobs built ahead are stale (blocks stored again): rebuilt")
            ready = None
        built_ahead = 0
        if ready is not None:
            blocks = [b for piece in ready.pieces for b in piece]
            built_ahead = self._restore_ready(ready, starts)
        else:
            blocks = [self.store.get(b) for b in ids]
            for r in self._restore_ranges([b.n_tokens for b in blocks]):
                self._restore_piece(blocks[r.start : r.stop], starts)
        bt = self.table.block_tokens
        self.ctx.blocks_restored(
            {b.block_id: starts.get(b.block_id, b.block_id * bt) for b in blocks}, bt
        )
        n_bytes = sum(b.nbytes for b in blocks)
        self.store.stats.bytes_out += n_bytes
        return TransferResult(
            len(blocks),
            n_bytes,
            (time.perf_counter() - t0) * 1e3,
            tuple(b.block_id for b in blocks),
            built_ahead=built_ahead,
        )

    def prepare(self, block_ids: Sequence[int], *, ordered: bool = False) -> bool:
        """Build the blobs of a coming restore of exactly `block_ids` (host blocks; in that
        order with `ordered`, as `restore` takes them) on the builder's thread, beside the
        prefill; False when none is built (no staging buffer, nothing harvested yet, a
        block not in the store, or too large). A build already in hand of exactly those
        blocks, still stored as they were, is kept."""
        if self.ahead is None or self.layout is None or not block_ids:
            return False
        ids = list(block_ids) if ordered else sorted(block_ids)
        if not self._pending_ids.isdisjoint(ids):  # a block still on its way to the store
            self.flush()
        if any(b not in self.store for b in ids):
            return False
        versions = [self.store.version(b) for b in ids]
        if self.ahead.holds(ids, versions):  # predicted before: its build goes on
            return True
        blocks = [self.store.get(b) for b in ids]
        ranges = self._restore_ranges([b.n_tokens for b in blocks])
        return self.ahead.start(self.layout, [blocks[r.start : r.stop] for r in ranges], versions)

    def drop_ahead(self) -> None:
        """Forget the blobs `prepare` built (a turn's plan is made: they served it or not)."""
        if self.ahead is not None:
            self.ahead.drop()

    def _restore_ready(self, ready: ReadyBlob, starts: Mapping[int, int]) -> int:
        """Restore the blobs built ahead, each piece once built (a piece whose build failed
        is built here); returns the blocks whose blob was built ahead."""
        ahead = 0
        for i, piece in enumerate(ready.pieces):
            blob = ready.piece(i)
            if blob is None:
                self._restore_piece(piece, starts)
                continue
            ahead += len(piece)
            self._set_blob(blob, piece, starts)
        prof = self.profile
        prof.add(TransferPath.STATE_BUILD_AHEAD, ready.build_ms, ready.nbytes, ahead)
        prof.add(TransferPath.AHEAD_WAIT, ready.wait_ms)
        return ahead

    def _restore_ranges(self, cells: Sequence[int]) -> list[range]:
        """A restore's pieces, the same whether its blobs are built ahead or here: those
        that fit the staging buffer, each cut into up to `RESTORE_PIECES` (one range where
        `_fitting` gives one: no staging buffer, a hybrid), so that a restore sends a piece
        built ahead while the builder builds the next."""
        ranges = self._fitting(cells)
        if self._whole:
            return ranges
        out: list[range] = []
        for r in ranges:
            step = -(-len(r) // RESTORE_PIECES)
            out += [range(i, min(i + step, r.stop)) for i in range(r.start, r.stop, step)]
        return out

    @property
    def _whole(self) -> bool:
        """A restore goes in one blob: no staging buffer to fit, or a hybrid's."""
        return self.staging is None or self.hybrid is not None

    def _fitting(self, cells: Sequence[int]) -> list[range]:
        """Consecutive index ranges of blocks (of `cells` cells each) whose blob fits the
        staging buffer: one range without a staging buffer, for a hybrid, and before the
        first harvest (the layout is not known)."""
        if not cells:
            return []
        if self._whole or self.layout is None:
            return [range(len(cells))]
        limit, layout = self.staging.limit_bytes, self.layout
        out: list[range] = []
        start, n = 0, 0
        for i, c in enumerate(cells):
            if i > start and 8 + kv_part_nbytes(layout, n + c) > limit:
                out.append(range(start, i))
                start, n = i, 0
            n += c
        out.append(range(start, len(cells)))
        return out

    def _restore_piece(self, blocks: list[BlockKV], starts: Mapping[int, int]) -> None:
        assert self.layout is not None
        prof = self.profile
        grow = self._grow_mark()
        with prof.timed(TransferPath.STATE_BUILD, calls=len(blocks)):
            n_cells = sum(b.n_tokens for b in blocks)
            if self.hybrid is not None:  # keeps the main sequence's recurrent state
                blob = self.hybrid.build(self.layout, blocks, RESTORE_SEQ)
            else:
                size = 8 + kv_part_nbytes(self.layout, n_cells)
                out = self.staging.view(size) if self.staging is not None else None
                blob = build_state(
                    self.layout, blocks, RESTORE_SEQ, out, copier=self.copier, native=self.native
                )
        self._note_grow(grow)
        self._set_blob(blob, blocks, starts)

    def _set_blob(self, blob: np.ndarray, blocks: list[BlockKV], starts: Mapping[int, int]) -> None:
        """State-write `blob` (the cells of `blocks`) and put them at `starts` in the main
        sequence."""
        prof = self.profile
        with prof.timed(TransferPath.STATE_SET, len(blob)):
            self.ctx.set_state(blob, RESTORE_SEQ, positions=[b.positions for b in blocks])
        bt = self.table.block_tokens
        own = {b.block_id: b.block_id * bt for b in blocks}
        target = {b: starts.get(b, p) for b, p in own.items()}
        self._shift(RESTORE_SEQ, move_order(own, target, bt))
        with prof.timed(TransferPath.SEQ_CP):
            self.ctx.seq_cp(RESTORE_SEQ, MAIN_SEQ, -1, -1)
        with prof.timed(TransferPath.SEQ_RM):
            self.ctx.seq_rm(RESTORE_SEQ, -1, -1)

    def held_bytes(self) -> dict[str, float | int | None]:
        """The host buffers held now: the staging buffer (its size follows the largest
        harvest or restore blob, up to its limit: `--kvmem-harvest-tokens` sets the harvest
        blob) and the buffer of the blobs built ahead; `bytes` is their sum."""
        staging = self.staging.capacity if self.staging is not None else 0
        ahead = self.ahead.buffer.capacity if self.ahead is not None else 0
        return {"bytes": staging + ahead, "staging_bytes": staging, "ahead_bytes": ahead}

    def close(self) -> None:
        self.flush()
        if self.ahead is not None:
            self.ahead.close()
        if self.staging is not None:
            self.staging.close()
        if self.copier is not None:
            self.copier.shutdown(wait=True)

    def evict(self, starts: Mapping[int, int]) -> int:
        """Drop host-backed blocks (block id -> first position of its cells) from the
        context; returns the cells freed."""
        bt = self.table.block_tokens
        for b in starts:
            if b not in self._pending_ids and b not in self.store:
                raise KVTransferError(f"block {b} would be lost: it is not in the host store")
        # every start is a multiple of the block size: remove contiguous cells together
        runs = block_runs([p // bt for p in starts.values()])
        with self.profile.timed(TransferPath.SEQ_RM, calls=len(runs)):
            for run in runs:
                self.ctx.seq_rm(MAIN_SEQ, run.start * bt, run.stop * bt)
        return len(starts) * bt

    def move(self, current: Mapping[int, int], target: Mapping[int, int]) -> int:
        """Shift GPU blocks from current[b] to target[b]; returns the blocks moved."""
        moves = move_order(current, {b: target[b] for b in current}, self.table.block_tokens)
        self._shift(MAIN_SEQ, moves)
        return len(moves)

    def _shift(self, seq: int, moves: Sequence[BlockMove]) -> None:
        bt = self.table.block_tokens
        with self.profile.timed(TransferPath.SEQ_ADD, calls=len(moves)):
            for m in moves:
                self.ctx.seq_add(seq, m.src, m.src + bt, m.delta)
