"""Which blocks leave the GPU when a decode outside prefill needs room (pure).

Prefill and reselection follow the planner. Generation and query replay only need cells:
this generation's oldest complete blocks go first (the ring spill), then the window's
blocks by preference (retrieved, unpinned, pinned; oldest first), never the newest complete
block, and an image's blocks always together. The window applies the result.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from kvmem.memory.planner import WindowPlan, block_groups
from kvmem.memory.spans import TokenSpan


@dataclass(frozen=True, slots=True)
class Residency:
    """What the choice reads: the GPU blocks and the history's size."""

    gpu_blocks: tuple[int, ...]  # ascending
    n_tokens: int
    n_complete: int
    block_tokens: int


@dataclass(frozen=True, slots=True)
class RoomPlan:
    spilled: tuple[int, ...]  # this generation's blocks
    evicted: tuple[int, ...]  # the window's blocks

    @property
    def victims(self) -> tuple[int, ...]:
        return self.spilled + self.evicted


def plan_room(
    res: Residency,
    n_blocks: int,
    gen_start: int | None,
    last_plan: WindowPlan | None,
    groups: Sequence[TokenSpan] = (),
) -> RoomPlan:
    """At least n_blocks victims when the window has them (fewer: the caller fails)."""
    units = block_groups(groups, res.block_tokens, res.n_complete)
    spill = generation_spill(res, gen_start) if gen_start is not None else []
    spilled = whole_groups(spill, n_blocks, (), units, res.gpu_blocks)
    evicted: list[int] = []
    if len(spilled) < n_blocks:
        order = eviction_order(res, set(spilled), last_plan)
        evicted = whole_groups(order, n_blocks - len(spilled), spilled, units, res.gpu_blocks)
    return RoomPlan(tuple(spilled), tuple(evicted))


def generation_spill(res: Residency, gen_start: int) -> list[int]:
    """Complete GPU blocks of this generation, oldest first, never the block before the
    next token."""
    bt = res.block_tokens
    newest = (res.n_tokens - 1) // bt
    return [b for b in res.gpu_blocks if (b + 1) * bt > gen_start and b < newest]


def eviction_order(
    res: Residency, taken: Collection[int], last_plan: WindowPlan | None
) -> list[int]:
    """Complete GPU blocks by preference: retrieved, then unpinned, then the pinned tiers;
    oldest first within each; never the newest complete block."""
    gpu = [b for b in res.gpu_blocks if b < res.n_complete - 1 and b not in taken]
    retrieved = set(last_plan.retrieved) if last_plan else set()
    pinned = set(last_plan.selected) - retrieved if last_plan else set()
    return sorted(gpu, key=lambda b: (0 if b in retrieved else 2 if b in pinned else 1, b))


def whole_groups(
    order: Sequence[int],
    n_blocks: int,
    taken: Iterable[int],
    units: Mapping[int, tuple[int, ...]],
    on_gpu: Collection[int],
) -> list[int]:
    """At least n_blocks of `order` (when it has them), an image's blocks all together: a
    group with a GPU member outside `order` (the newest block, already taken) is skipped."""
    allowed, done = set(order), set(taken)
    resident = set(on_gpu)
    out: list[int] = []
    for b in order:
        if len(out) >= n_blocks:
            break
        if b in done:
            continue
        unit = [m for m in units.get(b, (b,)) if m in resident]
        if all(m in allowed and m not in done for m in unit):
            out.extend(unit)
            done.update(unit)
    return out
