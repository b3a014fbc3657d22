"""The MTP draft context's own host copies of its blocks: the draft KV follows the window.

The target's host store keeps the trunk's attention layers only; the nextn layer's K/V of
a block lives in the draft context. So when the target harvests a block, the drafter
harvests the same block (the same positions, its own positions) from the draft context
into a host store of its own, one copy per block id, replaced by the next harvest of that
id and dropped when the block's tokens are cut; when the target restores blocks (at their
own positions or moved), the same blocks go into the draft context at the same positions.
Both go through a KVTransfer over the draft context (its plain attention cache of the one
nextn layer), so the copy in and out is the window's own code. A block whose cells the
draft context does not hold in full (a backlog gap) gets no copy, and a block without a
copy is not restored: draft quality only, since every draft is verified by the target.
A block the target harvests while its last rows are still in the drafter's backlog (the
draft gate kept the steps plain) is copied after the next catch-up, so that a plain step
never decodes on the draft context; if the target evicts it before then, it has no copy.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from kvmem.memory.block_table import BlockTable
from kvmem.memory.draft_mirror import PositionSet
from kvmem.memory.host_store import HostStore

from ..llama.batch_rows import MAIN_SEQ
from ..llama.context import LlamaContext
from ..transfer.kv_transfer import KVTransfer

logger = logging.getLogger(__name__)


class MtpBlocks:
    """Host copies of the draft context's complete blocks (block id -> nextn K/V)."""

    def __init__(self, ctx: LlamaContext, mirrored: PositionSet) -> None:
        self.ctx = ctx
        self.mirrored = mirrored  # positions whose cells hold the target's rows
        self.store = HostStore()
        self._transfer: KVTransfer | None = None  # made on the first harvest (block size)
        self.restored = 0  # blocks restored into the draft context
        self.deferred: set[int] = set()  # harvested by the target while in the backlog
        self._bt = 0  # block size, from the first harvest

    def _kv(self, block_tokens: int) -> KVTransfer:
        if self._transfer is None:
            table = BlockTable(block_tokens)  # only its block size is used
            self._transfer = KVTransfer(self.ctx, table, self.store, None, staging_bytes=0)
        return self._transfer

    def harvest(self, block_ids: Sequence[int], block_tokens: int, backlog_from: int) -> None:
        """Copy the blocks the target harvested (their own positions) when complete here;
        blocks with rows at or after `backlog_from` (still in the backlog) wait for the
        next catch-up (`harvest_deferred`)."""
        bt = block_tokens
        self._bt = bt
        self.store.drop(block_ids)  # older copies are stale
        now = [b for b in block_ids if (b + 1) * bt <= backlog_from]
        self.deferred.update(b for b in block_ids if (b + 1) * bt > backlog_from)
        whole = [b for b in now if self.mirrored.covers(b * bt, (b + 1) * bt)]
        if whole:
            self._kv(bt).harvest(whole)

    def harvest_deferred(self) -> None:
        """After a catch-up: copy the deferred blocks whose cells are all here now."""
        if self.deferred:
            deferred, self.deferred = sorted(self.deferred), set()
            self.harvest(deferred, self._bt, backlog_from=1 << 62)

    def restore(self, starts: Mapping[int, int], block_tokens: int) -> None:
        """Copy in the blocks the target restored, at the same first positions."""
        bt = block_tokens
        ids = [b for b in sorted(starts) if b in self.store]
        if not ids:
            return
        for b in ids:  # the cells there are no longer the target's: never two at a position
            self.ctx.seq_rm(MAIN_SEQ, starts[b], starts[b] + bt)
            self.mirrored.discard(starts[b], starts[b] + bt)
        self._kv(bt).restore(ids, starts)
        for b in ids:
            self.mirrored.add(starts[b], starts[b] + bt)
        self.restored += len(ids)
        logger.debug("restored %d draft blocks", len(ids))

    def drop_from(self, pos: int) -> None:
        """The tokens from `pos` on were cut (p < 0: all): their blocks' copies go."""
        gone = [b for b in self.store.block_ids() if pos < 0 or (b + 1) * self._bt > pos]
        self.store.drop(gone)
        self.deferred = {b for b in self.deferred if pos >= 0 and (b + 1) * self._bt <= pos}

    def close(self) -> None:
        if self._transfer is not None:
            self._transfer.close()
