"""The session's token history cut into fixed blocks, and where each block's KV lives.

Block b covers positions [b*B, (b+1)*B) of the history (B = block_tokens). A block is
*complete* once the history reaches (b+1)*B tokens; only complete blocks may be in the
host store. The last block may be partial (the open tail). Residency flags are set by
the engine; the table only keeps them consistent when the history is truncated.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from kvmem.errors import MemoryLayoutError

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class BlockInfo:
    """One block of the history."""

    block_id: int
    start: int  # first position
    end: int  # exclusive; less than start + block_tokens for the open tail block
    on_gpu: bool
    in_host: bool

    @property
    def n_tokens(self) -> int:
        return self.end - self.start


@dataclass(slots=True)
class TruncateResult:
    """What `BlockTable.truncate` changed."""

    n_tokens: int  # the new history length
    dropped_blocks: tuple[int, ...]  # blocks that lost tokens or vanished; drop their host copies
    reopened_block: int | None  # the block left partial by the cut, if any


class BlockTable:
    """Token history plus per-block residency (GPU window, host store)."""

    def __init__(self, block_tokens: int) -> None:
        if block_tokens <= 0:
            raise MemoryLayoutError(f"block_tokens must be positive, got {block_tokens}")
        self._block_tokens = block_tokens
        self._buf = np.zeros(1024, dtype=np.int64)  # [capacity] token ids
        self._n = 0
        self._on_gpu: set[int] = set()
        self._in_host: set[int] = set()

    # history -----------------------------------------------------------------------

    @property
    def block_tokens(self) -> int:
        return self._block_tokens

    @property
    def n_tokens(self) -> int:
        return self._n

    @property
    def tokens(self) -> list[int]:
        """A copy of the token history."""
        return self._buf[: self._n].tolist()

    def token_array(self) -> np.ndarray:
        """A read-only view of the history: int64 [n_tokens]."""
        view = self._buf[: self._n]
        view.setflags(write=False)
        return view

    @property
    def n_complete_blocks(self) -> int:
        return self._n // self._block_tokens

    @property
    def n_blocks(self) -> int:
        """Blocks holding at least one token (complete ones plus the open tail)."""
        return -(-self._n // self._block_tokens)

    def complete_blocks(self) -> range:
        return range(self.n_complete_blocks)

    def append(self, tokens: Sequence[int]) -> tuple[int, ...]:
        """Extend the history; returns the ids of the blocks this append completed."""
        new = np.asarray(tokens, dtype=np.int64).reshape(-1)  # [n_new]
        before = self.n_complete_blocks
        end = self._n + new.shape[0]
        if end > self._buf.shape[0]:
            grown = np.zeros(max(end, 2 * self._buf.shape[0]), dtype=np.int64)  # [capacity]
            grown[: self._n] = self._buf[: self._n]
            self._buf = grown
        self._buf[self._n : end] = new
        self._n = end
        return tuple(range(before, self.n_complete_blocks))

    def truncate(self, n_tokens: int) -> TruncateResult:
        """Keep tokens[:n_tokens]; blocks from n_tokens // B on are no longer in the host.

        Blocks that vanish entirely also leave the GPU set; a block left partial keeps
        its GPU flag (the engine removes the cut cells itself).
        """
        if not 0 <= n_tokens <= self._n:
            raise MemoryLayoutError(f"cannot truncate {self._n} tokens to {n_tokens}")
        if n_tokens == self._n:
            return TruncateResult(n_tokens=n_tokens, dropped_blocks=(), reopened_block=None)
        old_blocks = self.n_blocks
        first_cut = n_tokens // self._block_tokens
        self._n = n_tokens
        kept_blocks = self.n_blocks
        self._in_host = {b for b in self._in_host if b < first_cut}
        self._on_gpu = {b for b in self._on_gpu if b < kept_blocks}
        reopened = first_cut if n_tokens % self._block_tokens else None
        dropped = tuple(range(first_cut, old_blocks))
        logger.debug("truncate to %d tokens: dropped blocks %s", n_tokens, dropped)
        return TruncateResult(n_tokens=n_tokens, dropped_blocks=dropped, reopened_block=reopened)

    def common_prefix(self, tokens: Sequence[int]) -> int:
        """Length of the longest common prefix of `tokens` and the history."""
        other = np.asarray(tokens, dtype=np.int64).reshape(-1)  # [n_other]
        m = min(other.shape[0], self._n)
        differ = np.flatnonzero(other[:m] != self._buf[:m])  # [n_diff]
        return int(differ[0]) if differ.shape[0] else m

    def info(self, block_id: int) -> BlockInfo:
        self._check_exists(block_id)
        start = block_id * self._block_tokens
        return BlockInfo(
            block_id=block_id,
            start=start,
            end=min(start + self._block_tokens, self._n),
            on_gpu=block_id in self._on_gpu,
            in_host=block_id in self._in_host,
        )

    # residency ---------------------------------------------------------------------

    def mark_on_gpu(self, block_ids: Iterable[int]) -> None:
        ids = list(block_ids)
        for b in ids:
            self._check_exists(b)
        self._on_gpu.update(ids)

    def mark_off_gpu(self, block_ids: Iterable[int]) -> None:
        self._on_gpu.difference_update(block_ids)

    def mark_in_host(self, block_ids: Iterable[int]) -> None:
        ids = list(block_ids)
        for b in ids:
            if not 0 <= b < self.n_complete_blocks:
                raise MemoryLayoutError(
                    f"block {b} is not complete ({self.n_complete_blocks} complete blocks); "
                    "only complete blocks can be in the host store"
                )
        self._in_host.update(ids)

    def mark_not_in_host(self, block_ids: Iterable[int]) -> None:
        self._in_host.difference_update(block_ids)

    def gpu_blocks(self) -> tuple[int, ...]:
        return tuple(sorted(self._on_gpu))

    def host_blocks(self) -> tuple[int, ...]:
        return tuple(sorted(self._in_host))

    def is_on_gpu(self, block_id: int) -> bool:
        return block_id in self._on_gpu

    def is_in_host(self, block_id: int) -> bool:
        return block_id in self._in_host

    def _check_exists(self, block_id: int) -> None:
        if not 0 <= block_id < self.n_blocks:
            raise MemoryLayoutError(
                f"block {block_id} does not exist ({self._n} tokens, {self.n_blocks} blocks)"
            )


def block_runs(block_ids: Sequence[int]) -> list[range]:
    """Consecutive ids grouped into runs: [1,2,3,7,8] -> [range(1,4), range(7,9)]."""
    runs: list[range] = []
    for b in sorted(block_ids):
        if runs and runs[-1].stop == b:
            runs[-1] = range(runs[-1].start, b + 1)
        else:
            runs.append(range(b, b + 1))
    return runs
