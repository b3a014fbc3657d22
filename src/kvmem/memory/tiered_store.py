"""A disk tier under the RAM block store: `TieredStore` implements `BlockStore`.

Every block put is kept in RAM (a `HostStore`) and queued for a writer thread, which
writes it to `DIR/blocks/bNNNNNNNN.kvb` (block_file format: raw rows + BLAKE2b trailer)
through a temporary file, fsync and an atomic rename, then reads the file back and checks
its digest. Only then is the block *durable*, and only a durable block may lose its RAM
copy: past the RAM cap (`--kvmem-host-mib`) the least recently used durable blocks are
dropped from RAM. A read of such a block goes through the RAM tier (file -> verify -> RAM).

A failed write (ENOSPC, a read-only directory, any OSError) degrades the store to RAM-only
with one warning: nothing leaves RAM any more, and no block is lost. A full disk tier
(`--kvmem-disk-mib`) keeps new blocks in RAM the same way.

The writer also runs checkpoints (`checkpoint`), queued behind the writes they depend on,
which commit a session manifest naming only durable blocks (memory/session_manifest.py).
numpy + stdlib only.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import queue
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from kvmem.errors import ConfigError, KVTransferError, StoreCorruptError
from kvmem.memory.block_file import block_parts, decode_block, encoded_size, new_hasher
from kvmem.memory.host_store import BlockKV, BlockLedger, HostStore, LedgerQueries

logger = logging.getLogger(__name__)

MIB = 1 << 20
Opener = Callable[[str], IO[bytes]]  # opens a new file for writing (a seam for tests)


@dataclass(slots=True)
class TierStats:
    """Cumulative counters of the tiers (reads are `get` calls)."""

    ram_hits: int = 0  # reads served from RAM
    ram_misses: int = 0  # reads that had to go to disk
    disk_read_bytes: int = 0
    disk_write_bytes: int = 0
    disk_blocks_written: int = 0
    write_failures: int = 0
    ram_evictions: int = 0  # RAM copies dropped because a durable disk copy exists
    checkpoints: int = 0
    checkpoint_tokens: int = 0  # tokens covered by the last committed checkpoint


@dataclass(slots=True)
class _OnDisk:
    version: int
    digest: bytes
    size: int


@dataclass(slots=True)
class _Entry:
    version: int


def _default_opener(path: str) -> IO[bytes]:
    return open(path, "xb")  # noqa: SIM115 - closed by the writer


class TieredStore(LedgerQueries):
    """RAM tier over a disk tier, with a writer thread. Implements `BlockStore`."""

    def __init__(
        self,
        directory: str | Path,
        *,
        ram_cap_bytes: int = 0,
        disk_cap_bytes: int = 0,
        fingerprint: str = "",
        opener: Opener | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.blocks_dir = self.directory / "blocks"
        self.blocks_dir.mkdir(parents=True, exist_ok=True)
        self._lock_file = lock_directory(self.directory)
        for stale in [*self.blocks_dir.glob(".b*.tmp"), *self.directory.glob(".*.tmp")]:
            stale.unlink(missing_ok=True)  # a write a killed process left half done
        self.ram_cap = ram_cap_bytes  # 0: unlimited
        self.disk_cap = disk_cap_bytes  # 0: unlimited
        self._fingerprint = fingerprint
        self._open = opener or _default_opener
        self._ram = HostStore(fingerprint)
        self._lru: OrderedDict[int, None] = OrderedDict()  # RAM residents, oldest first
        self._entries: dict[int, _Entry] = {}
        self._disk: dict[int, _OnDisk] = {}  # what each block file holds now
        self._summary_saved: dict[int, int] = {}  # block id -> version whose summary is saved
        self._version = 0
        self._lock = threading.Lock()
        self._ledger = BlockLedger()  # the bytes of every block, whichever tier holds it
        self.tier = TierStats()
        self.degraded: str | None = None  # the reason, once writes stopped
        self._disk_full_warned = False
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._idle = threading.Condition(self._lock)
        self._pending = 0
        self._thread = threading.Thread(target=self._run, name="kvmem-disk-writer", daemon=True)
        self._thread.start()

    # BlockStore --------------------------------------------------------------------------
    def put(self, block: BlockKV) -> None:
        with self._lock:
            self._ram.put(block)
            self._version += 1
            old = self._entries.get(block.block_id)
            self._entries[block.block_id] = entry = _Entry(self._version)
            self._ledger.stored(block.block_id, self._ram.get(block.block_id).nbytes)
            self._touch(block.block_id)
            if old is not None:
                self._summary_saved.pop(block.block_id, None)
            self._submit("write", (block.block_id, entry.version))

    def get(self, block_id: int) -> BlockKV:
        with self._lock:
            entry = self._entries.get(block_id)
            if entry is None:
                raise KVTransferError(f"block {block_id} is not in the block store")
            if block_id in self._lru:
                self.tier.ram_hits += 1
                self._touch(block_id)
                return self._ram.get(block_id)
            on_disk = self._disk[block_id]
        try:
            data = (self.blocks_dir / _name(block_id)).read_bytes()
            block, digest = decode_block(data, block_id)
        except (OSError, StoreCorruptError) as exc:
            raise KVTransferError(f"block {block_id} cannot be read from disk: {exc}") from exc
        if digest != on_disk.digest:
            raise KVTransferError(f"block {block_id} on disk is another version")
        with self._lock:
            self.tier.ram_misses += 1
            self.tier.disk_read_bytes += len(data)
            if self._entries.get(block_id) is entry:
                self._ram.put(block)
                self._touch(block_id)
                self._shrink_ram()
            return block

    def drop(self, block_ids: Iterable[int]) -> int:
        with self._lock:
            gone, freed = self._ledger.dropped(block_ids)
            for block_id in gone:
                del self._entries[block_id]
                self._ram.drop([block_id])
                self._lru.pop(block_id, None)
                self._summary_saved.pop(block_id, None)
                self._submit("unlink", block_id)
        return freed

    def block_ids(self) -> tuple[int, ...]:
        with self._lock:
            return self._ledger.block_ids()

    # tiers -------------------------------------------------------------------------------
    @property
    def ram_bytes(self) -> int:
        return self._ram.nbytes

    @property
    def ram_blocks(self) -> int:
        return len(self._ram)

    @property
    def disk_bytes(self) -> int:
        with self._lock:
            return sum(d.size for d in self._disk.values())

    @property
    def disk_blocks(self) -> int:
        return len(self._disk)

    def is_durable(self, block_id: int) -> bool:
        with self._lock:
            return self._durable(block_id)

    def versions(self, block_ids: Sequence[int]) -> list[int]:
        """The current version of each block (for a checkpoint snapshot)."""
        with self._lock:
            return [self._entries[b].version for b in block_ids]

    def summaries_needed(self, block_ids: Sequence[int]) -> list[int]:
        """Blocks whose current version has no saved summary yet."""
        with self._lock:
            return [
                b
                for b in block_ids
                if b in self._entries and self._summary_saved.get(b) != self._entries[b].version
            ]

    def adopt(self, block: BlockKV, digest: bytes, size: int) -> None:
        """Register a block whose verified file already holds it (a store loaded at start).

        It stays in RAM only while the RAM cap has room.
        """
        with self._lock:
            self._ram.put(block)
            self._version += 1
            self._entries[block.block_id] = _Entry(self._version)
            self._ledger.stored(block.block_id, self._ram.get(block.block_id).nbytes, count=False)
            self._disk[block.block_id] = _OnDisk(self._version, digest, size)
            self._touch(block.block_id)
            self._shrink_ram()

    def mark_summary_saved(self, block_id: int, version: int) -> None:
        with self._lock:
            self._summary_saved[block_id] = version

    def disk_digest(self, block_id: int, version: int) -> bytes | None:
        """The digest of the block file when it holds `version` durably, else None."""
        with self._lock:
            d = self._disk.get(block_id)
            return d.digest if d is not None and d.version == version else None

    def checkpoint(self, job: Callable[[TieredStore], None]) -> None:
        """Run `job(self)` on the writer thread after every write queued before it."""
        with self._lock:
            self._submit("job", job)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until the writer has nothing queued; False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def close(self) -> None:
        """Finish queued work and stop the writer."""
        if not self._thread.is_alive():
            return
        with self._lock:
            self._submit("stop", None)
        self._thread.join()
        self._lock_file.close()

    # internals ---------------------------------------------------------------------------
    def _submit(self, kind: str, payload: Any) -> None:
        self._pending += 1
        self._queue.put((kind, payload))

    def _touch(self, block_id: int) -> None:
        self._lru[block_id] = None
        self._lru.move_to_end(block_id)

    def _durable(self, block_id: int) -> bool:
        d, e = self._disk.get(block_id), self._entries.get(block_id)
        return d is not None and e is not None and d.version == e.version

    def _shrink_ram(self) -> None:
        """Drop the RAM copies of the least recently used durable blocks past the cap."""
        if not self.ram_cap:
            return
        for block_id in list(self._lru):
            if self._ram.nbytes <= self.ram_cap:
                return
            if self._durable(block_id):
                self._ram.drop([block_id])
                del self._lru[block_id]
                self.tier.ram_evictions += 1

    def _run(self) -> None:
        while True:
            kind, payload = self._queue.get()
            try:
                if kind == "write":
                    self._write(*payload)
                elif kind == "unlink":
                    self._unlink(payload)
                elif kind == "job":
                    payload(self)
                else:
                    return
            except Exception:  # the writer must survive anything: blocks stay in RAM
                logger.exception("disk tier %s task failed", kind)
            finally:
                with self._idle:
                    self._pending -= 1
                    self._idle.notify_all()

    def _write(self, block_id: int, version: int) -> None:
        with self._lock:
            entry = self._entries.get(block_id)
            if self.degraded or entry is None or entry.version != version:
                return  # dropped or replaced meanwhile: the newer task writes it
            block = self._ram.get(block_id)
            size = encoded_size(block)
            old = self._disk.get(block_id)
            used = sum(d.size for d in self._disk.values()) - (old.size if old else 0)
            if self.disk_cap and used + size > self.disk_cap:
                if not self._disk_full_warned:
                    logger.warning(
                        "kvmem disk tier is full (%d of %d MiB): new blocks stay in RAM",
                        used // MIB,
                        self.disk_cap // MIB,
                    )
                    self._disk_full_warned = True
                return
        try:
            digest = self._write_file(block)
        except OSError as exc:
            self._degrade(f"{exc.strerror or exc} writing block {block_id}")
            return
        with self._lock:
            self.tier.disk_write_bytes += size
            self.tier.disk_blocks_written += 1
            self._disk[block_id] = _OnDisk(version, digest, size)
            self._shrink_ram()

    def _write_file(self, block: BlockKV) -> bytes:
        final = self.blocks_dir / _name(block.block_id)
        tmp = self.blocks_dir / f".{_name(block.block_id)}.{os.getpid()}.tmp"
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        try:
            hasher = new_hasher()
            with self._open(str(tmp)) as fh:
                for part in block_parts(block):
                    hasher.update(part)
                    fh.write(part)
                h = hasher.digest()
                fh.write(h)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, final)
            _fsync_dir(self.blocks_dir)
            _, check = decode_block(final.read_bytes(), block.block_id)
        except StoreCorruptError as exc:
            raise OSError(f"verification failed: {exc}") from exc
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()
        if check != h:
            raise OSError("verification failed: the file read back differs")
        return h

    def _unlink(self, block_id: int) -> None:
        with self._lock:
            if block_id in self._entries:
                return  # put again after the drop: the new write replaces the file
            had = self._disk.pop(block_id, None)
        if had is not None:
            with contextlib.suppress(OSError):
                (self.blocks_dir / _name(block_id)).unlink()

    def _degrade(self, reason: str) -> None:
        with self._lock:
            self.tier.write_failures += 1
            if self.degraded:
                return
            self.degraded = reason
        logger.warning(
            "kvmem disk tier %s: %s; continuing RAM-only (no block is lost, "
            "nothing more is written to disk)",
            self.directory,
            reason,
        )


def lock_directory(directory: Path) -> IO[bytes]:
    """Hold an exclusive lock on DIR/lock for the store's life (one process per store)."""
    fh = open(directory / "lock", "ab")  # noqa: SIM115 - held until close()
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.close()
        raise ConfigError(
            "--kvmem-disk-dir", f"{directory} is in use by another kvmem process"
        ) from None
    return fh


def _name(block_id: int) -> str:
    return f"b{block_id:08d}.kvb"


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def read_block_file(directory: Path, block_id: int) -> tuple[BlockKV, bytes, int]:
    """Read and verify one block file of a store: (block, digest, file size)."""
    data = (Path(directory) / "blocks" / _name(block_id)).read_bytes()
    block, digest = decode_block(data, block_id)
    return block, digest, len(data)


__all__ = ["MIB", "TierStats", "TieredStore", "read_block_file"]
