"""Where each block of the window sits among the context's positions (policy only).

A block's tokens have their own positions in the conversation. `PositionMode.ORIGINAL`
keeps every GPU block there, so the window has gaps where blocks are in the host store.
`PositionMode.GATHER` keeps the run of selected blocks that starts the conversation (the
sink and the control text after it) and the run that ends at the open tail where they
are, and moves every other selected block (in chronological order) to the positions
right before the tail run, so that retrieved text sits next to the query as it
would in a short context; the distance between the query and a retrieved block is then
bounded by the window instead of the history. `PositionMode.COMPACT` moves the leading run
too, so that the whole window holds contiguous positions ending at the open tail, as
StreamingLLM lays out its cache: the sink is then as near the query as in a short context.
Blocks never swap order, and no position is held by two blocks. The engine moves the
cells; this module only says where they go.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from enum import Enum

from kvmem.errors import MemoryLayoutError


class PositionMode(Enum):
    ORIGINAL = "original"
    GATHER = "gather"
    COMPACT = "compact"


@dataclass(frozen=True, slots=True)
class BlockMove:
    block_id: int
    src: int  # first position now
    dst: int  # first position after the move

    @property
    def delta(self) -> int:
        return self.dst - self.src


def tail_run_start(selected: Collection[int], n_complete: int) -> int:
    """First block of the longest run of selected blocks that ends at block n_complete - 1."""
    start = n_complete
    while start > 0 and start - 1 in selected:
        start -= 1
    return start


def head_run_end(selected: Collection[int]) -> int:
    """One past the last block of the run of selected blocks that starts at block 0."""
    end = 0
    while end in selected:
        end += 1
    return end


def window_layout(
    selected: Collection[int],
    n_complete: int,
    block_tokens: int,
    mode: PositionMode,
) -> dict[int, int]:
    """The first position of every selected block (ids below n_complete)."""
    if any(b < 0 or b >= n_complete for b in selected):
        raise MemoryLayoutError(f"selected blocks {sorted(selected)} outside [0, {n_complete})")
    own = {b: b * block_tokens for b in selected}
    if mode is PositionMode.ORIGINAL:
        return own
    run = tail_run_start(selected, n_complete)
    head = 0 if mode is PositionMode.COMPACT else min(head_run_end(selected), run)
    movable = sorted(b for b in selected if head <= b < run)
    first = run - len(movable)
    for i, b in enumerate(movable):
        own[b] = (first + i) * block_tokens
    return own


def move_order(
    current: Mapping[int, int], target: Mapping[int, int], block_tokens: int
) -> list[BlockMove]:
    """Moves taking every block of `current` to `target`, in an order where no move lands
    on a block that has not left yet (a move selects its cells by their positions).

    Both layouts keep the blocks in chronological order, so moving the forward movers last
    first, then the backward movers first first, never collides; the order is checked.
    """
    moves = [BlockMove(b, current[b], target[b]) for b in sorted(current)]
    forward = sorted((m for m in moves if m.delta > 0), key=lambda m: m.src, reverse=True)
    backward = sorted((m for m in moves if m.delta < 0), key=lambda m: m.src)
    order = forward + backward
    occupied = {p: b for b, p in current.items()}  # first position -> block
    if len(occupied) != len(current):
        raise MemoryLayoutError("two blocks start at the same position")
    for m in order:
        if m.src % block_tokens or m.dst % block_tokens:
            raise MemoryLayoutError(f"move of block {m.block_id} is not block-aligned")
        if m.dst in occupied:
            raise MemoryLayoutError(
                f"block {m.block_id} would land on block {occupied[m.dst]} at {m.dst}"
            )
        del occupied[m.src]
        occupied[m.dst] = m.block_id
    return order
