"""The window's residency decisions outside reselection, each a pure plan.

A prefill chunk's stream window (`plan_stream`), room for decodes that are not prefill
(`plan_room`) and a cut of the history (`plan_cut`) are computed here from the block
table, the moved blocks and the config alone, never touching llama.cpp; `GpuWindow`
applies them and returns the `Moves` the turn adds to its stats.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kvmem.config import KVMemConfig
from kvmem.errors import KVTransferError
from kvmem.memory.block_table import BlockTable
from kvmem.memory.eviction import Residency, RoomPlan, plan_room
from kvmem.memory.kv_cells import FreshCells, KVCells, plan_lay
from kvmem.memory.planner import PlannerConfig, RetrievalMethod, WindowPlan, stream_window
from kvmem.memory.spans import PromptSpans, TokenSpan


def planner_config(config: KVMemConfig, method: RetrievalMethod | None = None) -> PlannerConfig:
    bounds = config.tier_tokens()
    return PlannerConfig(
        block_tokens=config.block_tokens,
        budget_tokens=config.budget,
        sink_blocks=config.sink_blocks,
        recent_blocks=config.recent_blocks,
        method=method or config.method,
        control_tokens=bounds["control"],
        query_tokens=bounds["query"],
        trajectory_tokens=bounds["trajectory"],
        stream_tokens=bounds["stream"],
        neighbor_blocks=config.neighbor_blocks,
    )


def keep_from(position: int, grid: int, block_tokens: int) -> int:
    """The first block of the chunk (on `grid`) holding `position`: a chunk at `position`
    keeps every block from there on."""
    return (position - position % grid) // block_tokens


@dataclass(frozen=True, slots=True)
class StreamAt:
    """Where a prefill chunk starts and what its stream window is computed from."""

    position: int
    spans: PromptSpans
    room: int  # KV cells for the window besides the chunk
    grid: int  # the absolute chunk grid (a multiple of the block size)


def stream_keep(config: KVMemConfig, at: StreamAt) -> set[int]:
    """The blocks before its chunk that a prefill chunk at `at.position` sees."""
    room = min(at.room, config.stream_cap) if config.stream_cap else at.room
    chunk_start = at.position - at.position % at.grid
    return set(stream_window(planner_config(config), chunk_start, at.spans, room))


def chunk_keep(config: KVMemConfig, at: StreamAt, done: int, block_tokens: int) -> set[int]:
    """The complete blocks (of the first `done`) a prefill chunk at `at.position` keeps:
    its stream window, and every block from its chunk's start on."""
    keep = stream_keep(config, at)
    keep.update(range(keep_from(at.position, at.grid, block_tokens), done))
    return keep


@dataclass(frozen=True, slots=True)
class StreamPlan:
    """What the GPU must change so a prefill chunk sees its stream window."""

    position: int
    evict: tuple[int, ...]  # complete blocks outside the window, or moved off their positions
    stage_in: tuple[int, ...]  # blocks of the window to restore at their own positions


def plan_stream(
    table: BlockTable, moved: Mapping[int, int], config: KVMemConfig, at: StreamAt
) -> StreamPlan:
    """The stream window of the start of the chunk holding `at.position` on the absolute
    grid, plus the blocks from there on, all at their own positions: a prefill that starts
    mid-chunk (after a reused prefix) so sees what the whole chunk of a fresh one sees."""
    done = table.n_complete_blocks
    keep = chunk_keep(config, at, done, table.block_tokens)
    out = tuple(sorted(b for b in table.gpu_blocks() if b < done and (b not in keep or b in moved)))
    missing = sorted(b for b in keep if not table.is_on_gpu(b) or b in out)
    return StreamPlan(at.position, out, tuple(missing))


def next_stream_stage_in(
    table: BlockTable, moved: Mapping[int, int], config: KVMemConfig, at: StreamAt
) -> tuple[int, ...]:
    """The blocks the first prefill chunk of a turn that goes on from `at.position` will
    stage in: the history cut there (moved blocks leave the GPU first, `plan_cut`), then
    that chunk's stream window (`plan_stream`). A prediction, exact when the next request
    extends the history from there with the same control spans."""
    bt = table.block_tokens
    done = min(at.position // bt, table.n_complete_blocks)  # complete after the cut
    keep = chunk_keep(config, at, done, bt)
    return tuple(sorted(b for b in keep if b < done and (not table.is_on_gpu(b) or b in moved)))


def next_lay_restore(
    table: BlockTable,
    moved: Mapping[int, int],
    cells: KVCells | None,
    resume: int,
    order: Sequence[int],
) -> tuple[int, ...]:
    """The blocks, in cell order, that the next turn's lay restores (canonical cell order)
    when it goes on from `resume` (a chunk start) on the fresh cells whose blocks are
    `order`: the history cut there first (moved blocks leave, `plan_cut`), then
    `plan_lay`. Pure; a prediction, exact when the next request extends the history from
    there with the same control spans."""
    if cells is None:
        return tuple(order)
    bt = table.block_tokens
    cut = plan_cut(table, moved, resume, keep_window=False)
    after = cells.copy()
    after.remove_blocks(cut.evict, moved, bt)
    after.remove(resume, -1)
    kept = [b for b in table.gpu_blocks() if b not in cut.evict and (b + 1) * bt <= resume]
    return plan_lay(after, order, kept, {}, bt).restore


@dataclass(frozen=True, slots=True)
class RoomChoice:
    """The blocks to evict so more tokens fit (empty: they fit already)."""

    room: RoomPlan
    spill: bool  # a generation's ring spill (else room for the tail or a replay)

    @property
    def victims(self) -> tuple[int, ...]:
        return self.room.victims


NO_ROOM_NEEDED = RoomChoice(RoomPlan((), ()), spill=False)


def plan_room_for(
    table: BlockTable,
    used: int,
    capacity: int,
    n_tokens: int,
    gen_start: int | None,
    last_plan: WindowPlan | None,
    groups: Sequence[TokenSpan],
) -> RoomChoice:
    """The host-backed blocks to evict so `n_tokens` more cells fit in `capacity` (`used`
    now): this generation's oldest blocks first (the ring spill), then retrieved blocks."""
    need = used + n_tokens - capacity
    if need <= 0:
        return NO_ROOM_NEEDED
    t = table
    residency = Residency(t.gpu_blocks(), t.n_tokens, t.n_complete_blocks, t.block_tokens)
    n_blocks = math.ceil(need / t.block_tokens)
    room = plan_room(residency, n_blocks, gen_start, last_plan, tuple(groups))
    if len(room.victims) < n_blocks:
        raise KVTransferError(
            f"cannot free {need} KV cells: the window holds no evictable block "
            f"(capacity {capacity}, used {used})"
        )
    return RoomChoice(room, spill=gen_start is not None)


@dataclass(frozen=True, slots=True)
class CutPlan:
    """Forgetting the history from `n_keep` on."""

    n_keep: int
    keep_window: bool  # a replay of the tail run: moved blocks stay
    evict: tuple[int, ...]  # moved blocks, whose cells may sit at or after the cut
    restore: int | None  # the block left partial, restored at its own positions first
    dropped: tuple[int, ...]  # the blocks whose host copies go


def plan_cut(
    table: BlockTable, moved: Mapping[int, int], n_keep: int, *, keep_window: bool
) -> CutPlan:
    """Unless `keep_window` (a replay of the tail run, which every moved block precedes),
    moved blocks leave the GPU first. A block left partial by the cut is on the GPU at its
    own positions afterwards."""
    bt = table.block_tokens
    if keep_window:
        if any(p + bt > n_keep or (b + 1) * bt > n_keep for b, p in moved.items()):
            raise KVTransferError(f"a moved block holds cells at or after {n_keep}")
        evict: tuple[int, ...] = ()
    else:
        evict = tuple(sorted(moved))
    cut = n_keep // bt
    partial = n_keep % bt and cut < table.n_complete_blocks
    off_gpu = not table.is_on_gpu(cut) or cut in evict
    restore = cut if partial and off_gpu else None
    dropped = tuple(range(cut, table.n_blocks)) if n_keep < table.n_tokens else ()
    return CutPlan(n_keep, keep_window, evict, restore, dropped)


@dataclass(frozen=True, slots=True)
class FreshPrefill:
    """What fixes the cells a fresh prefill of a prompt fills: its chunks, their stream
    windows and llama.cpp's ubatch and cache size."""

    spans: PromptSpans
    room: int  # KV cells for the stream window besides the chunk
    chunk_tokens: int
    stream_grid: int
    n_ubatch: int
    n_cells: int


@dataclass(slots=True)
class FreshRun:
    """A fresh prefill's cells once its chunks before `position` (a chunk start) are
    decoded, to go on from (`fresh_cells`)."""

    prefill: FreshPrefill
    cells: FreshCells
    position: int = 0

    def copy(self) -> FreshRun:
        return FreshRun(self.prefill, self.cells.copy(), self.position)


def fresh_cells(
    config: KVMemConfig, fresh: FreshPrefill, end: int, run: FreshRun | None = None
) -> FreshRun | None:
    """The cells of a fresh prefill once its chunks before `end` (a chunk start) are
    decoded: each chunk's evictions (`plan_stream` on a session holding exactly what the
    chunks before it left) and then its tokens; from `run` (left as it was) when that is
    of the same prefill and not past `end`. Pure: a model (memory/kv_cells.py); None
    where a chunk would stage blocks in, which the model does not cover."""
    bt = config.block_tokens
    going_on = run is not None and run.prefill == fresh and run.position <= end
    if going_on and run.position == end:
        return run  # nothing to model: the run itself, unchanged
    if going_on:
        run = run.copy()
    else:
        run = FreshRun(fresh, FreshCells(KVCells.empty(fresh.n_cells), bt, fresh.n_ubatch))
    cells, pos = run.cells, run.position
    while pos < end:
        stop = min(end, pos + fresh.chunk_tokens - pos % fresh.chunk_tokens)
        at = StreamAt(pos, fresh.spans, fresh.room, fresh.stream_grid)
        keep = chunk_keep(config, at, pos // bt, bt)
        if keep - cells.on_gpu:
            return None
        cells.chunk(pos, stop, keep)
        pos = stop
    run.position = pos
    return run
