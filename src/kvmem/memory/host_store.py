"""Host-memory copies of completed blocks: K and V rows of every attention layer.

Rows are kept in the KV cache's own type (raw bytes, f16/f32/q8_0/q5_0/q4_0), exactly as
llama.cpp's sequence-state blob holds them, so a restore is a bit-exact round trip.
`BlockStore` is the seam every tier implements: `TieredStore` (memory/tiered_store.py) puts a
disk tier under this RAM store, and a shared keyed store (docs/architecture.md) would
implement the same five operations.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from kvmem.errors import KVTransferError, MemoryLayoutError

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class BlockKV:
    """The KV of one block's cells, in the cache's own row format."""

    block_id: int
    positions: np.ndarray  # int32 [n_tokens], ascending
    # per attention layer, uint8 [n_tokens, k_row_bytes] and [n_tokens, v_row_bytes]
    k: list[np.ndarray] = field(default_factory=list)
    v: list[np.ndarray] = field(default_factory=list)
    # int32 [n_tokens, 3]: llama_kv_cell_ext (x, y, tok) of M-RoPE caches, else None
    ext: np.ndarray | None = None

    @property
    def n_tokens(self) -> int:
        return int(self.positions.shape[0])

    @property
    def nbytes(self) -> int:
        """Bytes of positions, K and V arrays."""
        return (
            int(self.positions.nbytes)
            + sum(int(a.nbytes) for a in self.k)
            + sum(int(a.nbytes) for a in self.v)
            + (int(self.ext.nbytes) if self.ext is not None else 0)
        )


@dataclass(slots=True)
class HostStoreStats:
    """Cumulative counters of a store."""

    blocks_stored: int = 0  # put calls
    blocks_dropped: int = 0  # blocks removed by drop
    bytes_in: int = 0  # bytes written to the store
    bytes_out: int = 0  # bytes read back for restores: counted by the restoring caller
    peak_bytes: int = 0  # the largest nbytes seen


@runtime_checkable
class BlockStore(Protocol):
    """Where completed blocks live off the GPU: put, get, drop, list, and a fingerprint.

    `fingerprint` names the KV format the blocks are in (model, hparams, cache types,
    block size, ...); a store that outlives the process refuses blocks of another one.
    """

    def put(self, block: BlockKV) -> None: ...

    def get(self, block_id: int) -> BlockKV: ...

    def drop(self, block_ids: Iterable[int]) -> int: ...

    def block_ids(self) -> tuple[int, ...]: ...

    def __contains__(self, block_id: object) -> bool: ...

    def __len__(self) -> int: ...

    def version(self, block_id: int) -> int: ...

    @property
    def nbytes(self) -> int: ...

    @property
    def stats(self) -> HostStoreStats: ...

    @property
    def fingerprint(self) -> str: ...


class BlockLedger:
    """The byte accounting of a store: each stored block's bytes, their total, and the
    store's cumulative counters (`HostStoreStats`). `HostStore` keeps one beside its dict
    of blocks, `TieredStore` one over both tiers (a block counts once, wherever it lives)."""

    def __init__(self) -> None:
        self._sizes: dict[int, int] = {}
        self._versions: dict[int, int] = {}  # block id -> the serial of its last `stored`
        self._serial = 0
        self._nbytes = 0
        self.stats = HostStoreStats()

    def stored(self, block_id: int, size: int, *, count: bool = True) -> None:
        """`block_id` now holds `size` bytes (replacing what it held); `count`: a put
        (False: a block registered again, e.g. found on disk at start)."""
        self._nbytes += size - self._sizes.get(block_id, 0)
        self._sizes[block_id] = size
        self._serial += 1
        self._versions[block_id] = self._serial
        if count:
            self.stats.blocks_stored += 1
            self.stats.bytes_in += size
            self.stats.peak_bytes = max(self.stats.peak_bytes, self._nbytes)

    def dropped(self, block_ids: Iterable[int]) -> tuple[list[int], int]:
        """Forget the stored ones of `block_ids`: (the ids that were stored, bytes freed)."""
        gone: list[int] = []
        freed = 0
        for block_id in block_ids:
            size = self._sizes.pop(block_id, None)
            if size is None:
                continue
            del self._versions[block_id]
            gone.append(block_id)
            freed += size
            self.stats.blocks_dropped += 1
        self._nbytes -= freed
        return gone, freed

    def __contains__(self, block_id: object) -> bool:
        return block_id in self._sizes

    def version(self, block_id: int) -> int:
        """Changes whenever `block_id` is stored again (its content may differ); 0: not stored."""
        return self._versions.get(block_id, 0)

    def __len__(self) -> int:
        return len(self._sizes)

    def block_ids(self) -> tuple[int, ...]:
        return tuple(sorted(self._sizes))

    @property
    def nbytes(self) -> int:
        return self._nbytes


class LedgerQueries:
    """The `BlockStore` queries a store answers from its `BlockLedger` and fingerprint."""

    _ledger: BlockLedger
    _fingerprint: str

    def __contains__(self, block_id: object) -> bool:
        return block_id in self._ledger

    def __len__(self) -> int:
        return len(self._ledger)

    def version(self, block_id: int) -> int:
        """Changes whenever `block_id` is stored again (its content may differ), never when
        it only moves between tiers; 0: not stored."""
        return self._ledger.version(block_id)

    def block_ids(self) -> tuple[int, ...]:
        return self._ledger.block_ids()

    @property
    def nbytes(self) -> int:
        """Exact bytes of the stored blocks' positions, K and V arrays (whichever tier)."""
        return self._ledger.nbytes

    @property
    def stats(self) -> HostStoreStats:
        return self._ledger.stats

    @property
    def fingerprint(self) -> str:
        """What the stored blocks' KV format is (empty: not tracked)."""
        return self._fingerprint


class HostStore(LedgerQueries):
    """Blocks in a dict, with exact byte accounting. Implements `BlockStore`.

    `put` takes ownership of the block: its arrays are made read-only, and arrays that
    are views into a larger buffer (a whole state blob) are copied first, so the store
    never keeps more memory alive than `nbytes` says.
    """

    def __init__(self, fingerprint: str = "") -> None:
        self._fingerprint = fingerprint
        self._blocks: dict[int, BlockKV] = {}
        self._ledger = BlockLedger()

    def put(self, block: BlockKV) -> None:
        """Store `block`, replacing a stored block with the same id."""
        _check_block(block)
        rows = _shared_rows(block) or _owned
        owned = BlockKV(
            block_id=block.block_id,
            positions=_owned(block.positions),
            k=[rows(a) for a in block.k],
            v=[rows(a) for a in block.v],
            ext=_owned(block.ext) if block.ext is not None else None,
        )
        self._blocks[owned.block_id] = owned
        self._ledger.stored(owned.block_id, owned.nbytes)

    def get(self, block_id: int) -> BlockKV:
        """The stored block (read-only arrays); KVTransferError if it is not stored.

        Does not count `stats.bytes_out`: not every read is a restore, so the caller that
        restores adds the bytes it sent to the GPU.
        """
        block = self._blocks.get(block_id)
        if block is None:
            raise KVTransferError(f"block {block_id} is not in the host store")
        return block

    def drop(self, block_ids: Iterable[int]) -> int:
        """Remove the blocks that are stored (others are ignored); returns the bytes freed."""
        gone, freed = self._ledger.dropped(block_ids)
        for block_id in gone:
            del self._blocks[block_id]
        return freed


def _shared_rows(block: BlockKV):
    """When the block's K and V arrays are views that exactly tile one buffer of their own
    (kv_transfer packs a harvested block that way), a function keeping them as they are
    (read-only); else None."""
    arrays = [*block.k, *block.v]
    if not arrays:
        return None
    base = arrays[0].base
    if not isinstance(base, np.ndarray) or not base.flags.owndata:
        return None
    if any(a.base is not base or not a.flags.c_contiguous for a in arrays):
        return None
    if sum(a.nbytes for a in arrays) != base.nbytes:
        return None

    def keep(a: np.ndarray) -> np.ndarray:
        a.setflags(write=False)
        return a

    return keep


def _owned(a: np.ndarray) -> np.ndarray:
    """`a` itself when it owns its data, else a compact copy; made read-only either way."""
    base = a.base
    compact = a.flags.c_contiguous and (
        a.flags.owndata
        or (isinstance(base, np.ndarray) and base.flags.owndata and base.nbytes == a.nbytes)
    )
    out = a if compact else np.array(a, copy=True, order="C")
    out.setflags(write=False)
    return out


def _check_block(block: BlockKV) -> None:
    pos = block.positions
    if pos.dtype != np.int32 or pos.ndim != 1:
        raise MemoryLayoutError(
            f"positions must be int32 [n_tokens], got {pos.dtype} {list(pos.shape)}"
        )
    n = pos.shape[0]
    if n > 1 and not bool(np.all(np.diff(pos) > 0)):
        raise MemoryLayoutError(f"block {block.block_id}: positions are not ascending")
    if len(block.k) != len(block.v):
        raise MemoryLayoutError(
            f"block {block.block_id}: {len(block.k)} K layers, {len(block.v)} V layers"
        )
    for name, arrays in (("K", block.k), ("V", block.v)):
        for layer, a in enumerate(arrays):
            if a.dtype != np.uint8 or a.ndim != 2 or a.shape[0] != n:
                raise MemoryLayoutError(
                    f"block {block.block_id} {name} layer {layer}: expected uint8 [{n}, row_bytes], "
                    f"got {a.dtype} {list(a.shape)}"
                )
    ext = block.ext
    if ext is not None and (ext.dtype != np.int32 or ext.shape != (n, 3)):
        raise MemoryLayoutError(
            f"block {block.block_id}: cell extensions must be int32 [{n}, 3], "
            f"got {ext.dtype} {list(ext.shape)}"
        )
