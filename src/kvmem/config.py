"""KVMem settings shared by the engine, the CLI and the server, with their validation.

Validation raises `ConfigError` naming the flag, and runs before any model is loaded.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from kvmem.errors import ConfigError
from kvmem.memory.exact_scorer import RankMode
from kvmem.memory.ggml_types import GgmlType, parse_kv_type
from kvmem.memory.layout import PositionMode
from kvmem.memory.planner import RetrievalMethod
from kvmem.memory.scorer import ScoreAggregate, ScoreMode


class QueryReplay(Enum):
    """Whether the query is processed again after reselection changed the window."""

    AUTO = "auto"
    ON = "on"
    OFF = "off"


class QuerySource(Enum):
    """Which llama context computes the retrieval query's vectors."""

    MAIN = "main"  # the main context, through its eval callback
    SCORING = "scoring"  # a second small context (sink + query); the main one has no callback


class QueryAheadMode(Enum):
    """Whether the scoring source's query rows and block scores are computed beside the
    prefill (`engine/query_ahead.py`) or after it."""

    ON = "on"
    OFF = "off"


class QueryPolicy(Enum):
    """Which tokens form the retrieval query."""

    USER = "user"  # the last role=user message
    TAIL = "tail"  # the last tokens of the prompt
    AGENT = "agent"  # the last user message and the live trajectory's tail


def _available_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


@dataclass(frozen=True, slots=True)
class KVCacheTypes:
    """The K and V cache types of the main context."""

    k: GgmlType = GgmlType.F16
    v: GgmlType = GgmlType.F16

    @classmethod
    def from_names(cls, k: str, v: str, k_flag: str = "-ctk", v_flag: str = "-ctv") -> KVCacheTypes:
        types = cls(parse_kv_type(k, k_flag), parse_kv_type(v, v_flag))
        types.validate()
        return types

    def validate(self) -> None:
        if self.k.is_quantized != self.v.is_quantized:
            raise ConfigError(
                "-ctk/-ctv",
                f"K/V cache types {self.k.label}/{self.v.label} mix a float and a quantized type; "
                "use two float types (f16, f32) or two quantized types (q8_0, q5_0, q4_0)",
            )


@dataclass(frozen=True, slots=True)
class KVMemConfig:
    """The `--kvmem-*` settings."""

    enabled: bool = True
    block_tokens: int = 128
    budget: int = 32768
    gen_reserve: int = 4096
    sink_blocks: int = 1
    recent_blocks: int = 2
    method: RetrievalMethod = RetrievalMethod.RETRIEVAL
    query_replay: QueryReplay = QueryReplay.AUTO
    query_policy: QueryPolicy = QueryPolicy.AGENT
    query_max_tokens: int = 512
    query_source: QuerySource = QuerySource.MAIN
    query_ahead: QueryAheadMode = QueryAheadMode.ON  # with the scoring source only
    control_tokens: int = -1  # bound of the control tier; -1: budget / 4
    trajectory_tokens: int = -1  # bound of the trajectory tier; -1: budget / 4
    stream_tokens: int = -1  # newest tokens a prefill chunk sees; -1: budget / 2
    stream_cap: int = 0  # diagnostic cap on the KV tokens a prefill chunk sees; 0: none
    harvest_tokens: int = 0  # complete blocks harvested together once this many wait; 0: each
    rank: RankMode = RankMode.SUMMARY  # what ranks the retrieval candidates
    score_layers: tuple[int, ...] = ()  # empty: 8 layers spread over the depth
    score_mode: ScoreMode = ScoreMode.KEY_BOUND
    score_aggregate: ScoreAggregate = ScoreAggregate.MAX
    score_mlogits: int = 128  # bound on one reselection's logits, in millions; 0: none
    score_threads: int = 0  # threads scoring a reselection (0: one per core, at most 16)
    positions: PositionMode = PositionMode.GATHER
    trace: bool = False
    # disk tier and restart-safe sessions (memory/tiered_store.py, engine/session_persist.py)
    disk_dir: str | None = None
    host_mib: int = 0  # RAM cap of the block store; 0: unlimited
    disk_mib: int = 0  # disk cap; 0: unlimited
    conversations: int = 1  # sessions kept warm (engine/conversations.py)
    conversations_mib: int = 0  # cap on the conversations' stored blocks; 0: none

    def validate(self) -> None:
        """Raise ConfigError for the first invalid value, naming its flag."""
        _positive("--kvmem-block-tokens", self.block_tokens)
        if self.block_tokens % 32 != 0:
            raise ConfigError(
                "--kvmem-block-tokens", f"must be a multiple of 32, got {self.block_tokens}"
            )
        _positive("--kvmem-budget", self.budget)
        _positive("--kvmem-gen-reserve", self.gen_reserve)
        _positive("--kvmem-query-max-tokens", self.query_max_tokens)
        if self.sink_blocks < 0:
            raise ConfigError("--kvmem-sink-blocks", f"must be >= 0, got {self.sink_blocks}")
        if self.recent_blocks < 1:
            raise ConfigError("--kvmem-recent-blocks", f"must be >= 1, got {self.recent_blocks}")
        floor = (self.sink_blocks + self.recent_blocks) * self.block_tokens
        if self.budget < floor:
            raise ConfigError(
                "--kvmem-budget",
                f"{self.budget} tokens is smaller than sink + recent "
                f"({self.sink_blocks} + {self.recent_blocks} blocks of {self.block_tokens} = {floor} tokens)",
            )
        if self.gen_reserve < self.block_tokens:
            raise ConfigError(
                "--kvmem-gen-reserve",
                f"{self.gen_reserve} tokens is smaller than one block ({self.block_tokens} tokens)",
            )
        for flag, value in (
            ("--kvmem-control-tokens", self.control_tokens),
            ("--kvmem-trajectory-tokens", self.trajectory_tokens),
            ("--kvmem-stream-tokens", self.stream_tokens),
        ):
            if value < -1:
                raise ConfigError(flag, f"must be >= 0 (or -1 for the default), got {value}")
        if self.harvest_tokens < 0:
            raise ConfigError("--kvmem-harvest-tokens", f"must be >= 0, got {self.harvest_tokens}")
        if self.score_mlogits < 0:
            raise ConfigError("--kvmem-score-mlogits", f"must be >= 0, got {self.score_mlogits}")
        if self.score_threads < 0:
            raise ConfigError("--kvmem-score-threads", f"must be >= 0, got {self.score_threads}")
        if self.stream_cap < 0:
            raise ConfigError("--kvmem-stream-cap", f"must be >= 0, got {self.stream_cap}")
        if any(layer < 0 for layer in self.score_layers):
            raise ConfigError("--kvmem-score-layers", "layer indices must be >= 0")
        if self.query_ahead is QueryAheadMode.OFF and self.query_source is not QuerySource.SCORING:
            raise ConfigError(
                "--kvmem-query-ahead",
                "applies to --kvmem-query-source scoring only (the main source captures its "
                "query during the prefill)",
            )
        self._validate_disk_tier()

    def _validate_disk_tier(self) -> None:
        _positive("--kvmem-conversations", self.conversations)
        if self.conversations_mib < 0:
            raise ConfigError(
                "--kvmem-conversations-mib", f"must be >= 0, got {self.conversations_mib}"
            )
        if self.conversations_mib and self.conversations < 2:
            raise ConfigError("--kvmem-conversations-mib", "needs --kvmem-conversations N >= 2")
        if self.conversations > 1 and not self.enabled:
            raise ConfigError("--kvmem-conversations", "needs KVMem: drop --no-kvmem")
        for flag, value in (
            ("--kvmem-host-mib", self.host_mib),
            ("--kvmem-disk-mib", self.disk_mib),
        ):
            if value < 0:
                raise ConfigError(flag, f"must be >= 0, got {value}")
            if value and self.disk_dir is None:
                raise ConfigError(flag, "needs --kvmem-disk-dir (where blocks past the cap go)")
        if self.disk_dir is None:
            return
        if not self.enabled:
            raise ConfigError(
                "--kvmem-disk-dir", "needs KVMem (it stores KVMem blocks): drop --no-kvmem"
            )
        path = Path(self.disk_dir)
        if path.exists() and not path.is_dir():
            raise ConfigError("--kvmem-disk-dir", f"{self.disk_dir} exists and is not a directory")
        existing = next((p for p in (path, *path.parents) if p.exists()), None)
        if existing is None or not os.access(existing, os.W_OK | os.X_OK):
            raise ConfigError("--kvmem-disk-dir", f"{self.disk_dir} is not writable")

    def tier_tokens(self) -> dict[str, int]:
        """The tier bounds in force (defaults resolved), by tier name."""
        return {
            "control": self.control_tokens if self.control_tokens >= 0 else self.budget // 4,
            "query": min(self.query_max_tokens, self.budget // 4),
            "trajectory": self.trajectory_tokens
            if self.trajectory_tokens >= 0
            else self.budget // 4,
            "stream": self.stream_tokens if self.stream_tokens >= 0 else self.budget // 2,
        }

    @property
    def score_workers(self) -> int:
        """Threads that score one reselection (`--kvmem-score-threads`; 0: min(16, CPUs)).

        With more than one, the layers are scored side by side, each product on one
        OpenBLAS thread (`blas_threads`); with one, numpy's products run on OpenBLAS's own
        threads. On the H200 host (16 cores, 8B shape, 1,955 blocks, the 128M bound)
        `kvmem-bench score-cost` measured 705 ms on 1 thread, 388 ms on 4 and 215 ms on 16
        (docs/results/h200/s5), so the default is one thread per core, at most 16."""
        return self.score_threads or max(1, min(16, _available_cpus()))

    @property
    def query_pin_tokens(self) -> int:
        """The pinned (and replayed) part of the query: at most a quarter of the budget."""
        return self.tier_tokens()["query"]

    @property
    def gpu_cells(self) -> int:
        """KV cells the llama.cpp context needs: budget + generation reserve."""
        return self.budget + self.gen_reserve


def _positive(flag: str, value: int) -> None:
    if value <= 0:
        raise ConfigError(flag, f"must be a positive number, got {value}")


def lane_disk_dir(disk_dir: str | None, lane: int) -> str | None:
    """Lane `lane`'s store under --kvmem-disk-dir with --parallel: lane 0's is DIR itself
    (the --parallel 1 layout), lane k's DIR/lane-<k>."""
    if disk_dir is None or lane == 0:
        return disk_dir
    return str(Path(disk_dir) / f"lane-{lane}")
