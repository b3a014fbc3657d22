"""Per-turn counters, cumulative engine counters, and the KVMEM_* trace records."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from enum import Enum
from typing import TextIO

from kvmem.memory.tiered_store import TieredStore

logger = logging.getLogger(__name__)


class TraceKind(Enum):
    """The kinds of KVMEM_* trace record."""

    PREFILL = "PREFILL"  # a turn's prefill: reused, new, replayed tokens and block moves
    STREAM = "STREAM"  # a prefill chunk's window changed: blocks evicted and staged in
    EVICT = "EVICT"  # blocks evicted to make room outside prefill
    SPILL = "SPILL"  # the generation's oldest blocks moved to the host (ring spill)
    QUERY = "QUERY"  # a turn's query spans, its vector count and spans without vectors
    RESELECT = "RESELECT"  # the window chosen for a query, by tier
    TIER_DROP = "TIER_DROP"  # a pinned tier's blocks past its bound or the budget
    TRUNCATE = "TRUNCATE"  # history forgotten after a divergence
    GEN = "GEN"  # a turn's generation
    LOAD = "LOAD"  # a stored session loaded from --kvmem-disk-dir
    CHECKPOINT = "CHECKPOINT"  # a turn's history checkpointed to disk
    TIER = "TIER"  # host/disk tier counters
    SWITCH = "SWITCH"  # the GPU window switched to another conversation
    CONV_EVICT = "CONV_EVICT"  # a warm conversation evicted past --kvmem-conversations
    SPANS_UNLOCATED = "SPANS_UNLOCATED"  # a chat prompt's spans not found in its rendering
    CELLS_LAID = "CELLS_LAID"  # canonical order: a turn's start laid on a fresh prefill's cells
    CELLS_UNMODELLED = "CELLS_UNMODELLED"  # canonical order: a fresh prefill's cells unknown
    RECOMPUTE = "RECOMPUTE"  # retrieved blocks decoded again in the chosen window


class FinishReason(Enum):
    STOP = "stop"  # an end-of-generation token
    LENGTH = "length"  # max_tokens or the logical context
    CANCELLED = "cancelled"  # the caller stopped iterating or set the cancel event


@dataclass(frozen=True, slots=True)
class PrefillProgress:
    """Where a prompt's processing stands: llama-server's `prompt_progress` less the time.
    Reported once when the reused prefix is known and after each prefill chunk."""

    total: int  # the prompt's tokens
    cache: int  # reused from the session's history
    processed: int  # in the context now, the reused ones included


@dataclass(slots=True)
class TurnStats:
    """What one generate/teacher_force call did."""

    prompt_tokens: int = 0
    cached_tokens: int = 0  # reused prefix of the session history
    reprocessed_tokens: int = 0  # history tokens recomputed: their KV saw a chosen window
    prefill_tokens: int = 0  # new input processed for the first time
    prefill_ms: float = 0.0  # all prefill time: chunks, harvest, reselection, replay
    generated_tokens: int = 0
    decode_ms: float = 0.0
    stage_in_blocks: int = 0
    harvested_blocks: int = 0
    stage_in_bytes: int = 0
    built_ahead_blocks: int = 0  # stage-ins whose restore blob was built beside the prefill
    relaid_blocks: int = 0  # GPU blocks laid again at a turn's start (canonical cell order)
    relaid_bytes: int = 0
    harvested_bytes: int = 0  # bytes harvested to the host store
    harvest_ms: float = 0.0
    restore_ms: float = 0.0
    score_ms: float = 0.0
    reselect_ms: float = 0.0
    replayed_tokens: int = 0
    replay_ms: float = 0.0
    recomputed_tokens: int = 0  # retrieved blocks decoded again in the chosen window
    recompute_ms: float = 0.0
    deferred_tokens: int = 0  # the prompt's tail, decoded after the window was chosen
    spilled_blocks: int = 0
    evicted_blocks: int = 0
    truncated_tokens: int = 0
    draft_n: int = 0  # speculative draft tokens verified
    draft_n_accepted: int = 0  # of which accepted
    finish_reason: str = FinishReason.STOP.value

    def add(self, moves: Moves) -> None:
        """Count what a residency change did (the window's applies return it)."""
        for name in Moves.__slots__:
            setattr(self, name, getattr(self, name) + getattr(moves, name))


@dataclass(slots=True)
class Moves:
    """What one residency change did: blocks harvested, staged in, evicted, spilled, and
    its time. The window returns it; the turn adds it to its TurnStats."""

    harvested_blocks: int = 0
    harvested_bytes: int = 0
    harvest_ms: float = 0.0
    stage_in_blocks: int = 0
    stage_in_bytes: int = 0
    built_ahead_blocks: int = 0
    relaid_blocks: int = 0
    relaid_bytes: int = 0
    restore_ms: float = 0.0
    evicted_blocks: int = 0
    spilled_blocks: int = 0
    score_ms: float = 0.0
    reselect_ms: float = 0.0
    recomputed_tokens: int = 0
    recompute_ms: float = 0.0

    def __iadd__(self, other: Moves) -> Moves:
        for name in Moves.__slots__:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        return self


@dataclass(slots=True)
class EngineStats:
    """Counters summed over the engine's life."""

    turns: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    reprocessed_tokens: int = 0
    prefill_tokens: int = 0
    prefill_ms: float = 0.0
    generated_tokens: int = 0
    decode_ms: float = 0.0
    stage_in_blocks: int = 0
    harvested_blocks: int = 0
    stage_in_bytes: int = 0
    harvested_bytes: int = 0
    reselect_ms: float = 0.0
    replayed_tokens: int = 0
    spilled_blocks: int = 0
    draft_n: int = 0
    draft_n_accepted: int = 0
    host_store_bytes: int = 0
    host_blocks: int = 0
    gpu_cells_used: int = 0
    gpu_cells_max: int = 0
    gpu_cells_peak: int = 0
    # the disk tier (--kvmem-disk-dir); zero without one
    tier_ram_hits: int = 0
    tier_ram_misses: int = 0
    tier_ram_bytes: int = 0
    tier_ram_blocks: int = 0
    tier_disk_bytes: int = 0
    tier_disk_blocks: int = 0
    tier_disk_read_bytes: int = 0
    tier_disk_write_bytes: int = 0
    tier_write_failures: int = 0
    tier_degraded: int = 0
    # --kvmem-conversations
    conversations: int = 0
    conversation_switches: int = 0
    conversation_switch_ms: float = 0.0
    conversations_evicted: int = 0

    def add_turn(self, turn: TurnStats) -> None:
        self.turns += 1
        names = {f.name for f in fields(self)}
        for f in fields(turn):
            if f.name in names and f.name != "turns":
                setattr(self, f.name, getattr(self, f.name) + getattr(turn, f.name))

    def set_tiers(self, stores: Sequence[TieredStore]) -> None:
        """The tiered stores' totals (--kvmem-disk-dir: one store, or one per conversation)."""
        for name, value in tier_gauges(stores).items():
            setattr(self, name, value)


def tier_gauges(stores: Sequence[TieredStore]) -> dict[str, int]:
    """The disk tier's counters and gauges (`EngineStats.tier_*`) read now from `stores`; the
    stores lock what they count, so any thread may read them (the server's /metrics does, as
    the writer thread lands a turn's blocks after the turn's end)."""
    return {
        "tier_ram_hits": sum(s.tier.ram_hits for s in stores),
        "tier_ram_misses": sum(s.tier.ram_misses for s in stores),
        "tier_ram_bytes": sum(s.ram_bytes for s in stores),
        "tier_ram_blocks": sum(s.ram_blocks for s in stores),
        "tier_disk_bytes": sum(s.disk_bytes for s in stores),
        "tier_disk_blocks": sum(s.disk_blocks for s in stores),
        "tier_disk_read_bytes": sum(s.tier.disk_read_bytes for s in stores),
        "tier_disk_write_bytes": sum(s.tier.disk_write_bytes for s in stores),
        "tier_write_failures": sum(s.tier.write_failures for s in stores),
        "tier_degraded": int(any(s.degraded is not None for s in stores)),
    }


class Tracer:
    """Writes one `KVMEM_<KIND> key=value ...` line per event when enabled."""

    def __init__(self, enabled: bool, stream: TextIO | None = None) -> None:
        self.enabled = enabled
        self.stream = stream
        self.records: list[str] = []

    def emit(self, kind: TraceKind, **values: object) -> None:
        if not self.enabled:
            return
        parts = " ".join(f"{k}={_fmt(v)}" for k, v in values.items())
        line = f"KVMEM_{kind.value} {parts}"
        self.records.append(line)
        del self.records[:-1000]
        print(line, file=self.stream or sys.stderr, flush=True)


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.2f}"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value) or "-"
    return str(value)


def stats_dict(stats: TurnStats | EngineStats) -> dict[str, object]:
    return asdict(stats)
