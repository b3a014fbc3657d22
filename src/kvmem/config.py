"""KVMem settings shared by the engine, the CLI and the server, with their validation.

Validation raises `ConfigError` naming the flag, and runs before any model is loaded.
"""

from __future__ import annotations

import operator
import os
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from kvmem.errors import ConfigError
from kvmem.memory.exact_scorer import RankMode
from kvmem.memory.ggml_types import GgmlType, parse_kv_type
from kvmem.memory.layout import PositionMode
from kvmem.memory.lexical import MAX_DF_SHARE
from kvmem.memory.planner import RetrievalMethod
from kvmem.memory.scorer import ScoreAggregate, ScoreMode
from kvmem.settings import Group, Program, setting
from kvmem.settings.values import float_in_range, int32, layer_list

_KVMEM = {"programs": Program.BOTH, "group": Group.KVMEM}
# --kvmem-harvest-tokens: on the H200 (8B shape, 32K under budget) 4 reads of 8192 tokens
# took 445 ms against 926 ms for 16 reads of a 2048-token chunk each; docs/benchmarks.md
HARVEST_TOKENS = 8192
# --kvmem-chunk-tokens with the stream as wide as the room it leaves: on Qwen2.5-Coder-0.5B
# at 8x (-c 32768, budget 4096) the only setting measured to meet every needle, memory and
# fidelity line of issue 33 (docs/benchmarks.md, "GPU, session 18")
CHUNK_TOKENS = 512


def _n(default: int, name: str, help_text: str, shown: str | None = None) -> int:
    """An integer `--kvmem-*` setting (int32 range)."""
    return setting(default, name, help=help_text, parse=int32, metavar="N", shown=shown, **_KVMEM)


class LexicalMode(Enum):
    """Whether lexical scores (memory/lexical.py) join the retrieval ranking."""

    OFF = "off"
    FUSE = "fuse"  # reciprocal rank fusion of the attention ranking and BM25 over n-grams


class QueryReplay(Enum):
    """Whether the query is processed again after reselection changed the window."""

    AUTO = "auto"
    ON = "on"
    OFF = "off"


class CellOrder(Enum):
    """Where a window's blocks sit among llama.cpp's KV cells (the order attention sums in)."""

    CANONICAL = "canonical"  # a turn starts on a fresh prefill's cells: history-free sums
    FREE = "free"  # the first free cells llama.cpp finds: nothing re-laid


class QuerySource(Enum):
    """Which llama context computes the retrieval query's vectors."""

    MAIN = "main"  # the main context, through its eval callback
    SCORING = "scoring"  # a second small context (sink + query); the main one has no callback


class QueryAheadMode(Enum):
    """Whether the scoring source's query rows and block scores are computed beside the
    prefill (`engine/query_ahead.py`) or after it."""

    ON = "on"
    OFF = "off"


class RestoreAheadMode(Enum):
    """When the next turn's stream restore is built off its path (restore_ahead.py)."""

    GENERATION = "generation"  # from the prefill's end, beside the generation
    TURN_END = "turn-end"  # at the turn's end, in the client's pause


# --kvmem-recompute-above's default: the H100's 28K fidelity transcript and needle grid put
# the cross-over between 2x (agent 8K and the early turns lose) and 4x (they gain)
RECOMPUTE_ABOVE = 3.0


class RecomputeMode(Enum):
    """Whether the retrieved blocks are computed again inside the window a reselection
    chose (`engine/session/recompute.py`)."""

    OFF = "off"  # their KV as the prefill stream computed it
    RETRIEVED = "retrieved"  # every retrieved block decoded again against the blocks before it


class HarnessOverflow(Enum):
    """An agent harness's pinned control text past the budget (kvmem.chat.harness)."""

    REJECT = "reject"  # HTTP 413 naming what did not fit
    FALLBACK = "fallback"  # no pinning: the control tier's bound applies, as for any client


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
    """The `--kvmem-*` settings; each field declares its flag (kvmem.settings.setting)."""

    enabled: bool = setting(
        True, "--no-kvmem", help="plain llama.cpp with a full-size context (for comparison); "
        "another --kvmem-* flag set with it is refused, but for the trace",
        flag_default=False, to_field=operator.not_, dest="no_kvmem", shown="disabled",
        **_KVMEM,
    )  # fmt: skip
    budget: int = _n(32768, "--kvmem-budget", "GPU KV tokens for the selected working set")
    gen_reserve: int = _n(4096, "--kvmem-gen-reserve", "GPU KV tokens reserved for new tokens")
    block_tokens: int = _n(128, "--kvmem-block-tokens", "tokens per block")
    sink_blocks: int = _n(1, "--kvmem-sink-blocks", "blocks at the start always kept")
    recent_blocks: int = _n(2, "--kvmem-recent-blocks", "most recent blocks always kept")
    neighbor_blocks: int = _n(
        0, "--kvmem-neighbor-blocks",
        "retrieval: each retrieved block brings the candidate blocks up to N on either side "
        "of it, ahead of the next by score (0 = blocks by score alone)",
    )  # fmt: skip
    method: RetrievalMethod = setting(
        RetrievalMethod.RETRIEVAL, "--kvmem-method", help="block selection", **_KVMEM
    )
    score_mode: ScoreMode = setting(
        ScoreMode.KEY_BOUND, "--kvmem-score-mode",
        help="block summary scored against the query: bound (per-channel min/max, as in "
        "Quest) or mean (mean key)", **_KVMEM,
    )  # fmt: skip
    score_aggregate: ScoreAggregate = setting(
        ScoreAggregate.MAX, "--kvmem-score-aggregate",
        help="per-block score from the query rows' attention over blocks: mean (over tokens "
        "and heads) or max (the largest share any row gives the block)", **_KVMEM,
    )  # fmt: skip
    score_mlogits: int = _n(
        128, "--kvmem-score-mlogits",
        "bound on the logits (query rows x blocks x heads x layers, in millions) one "
        "reselection computes; past it an even sample of the query tokens is scored",
        "128; 0 = no bound",
    )  # fmt: skip
    score_threads: int = _n(
        0, "--kvmem-score-threads", "threads that score a reselection (0 = one per CPU, at most 16)"
    )
    positions: PositionMode = setting(
        PositionMode.COMPACT, "--kvmem-positions",
        help="where retrieved blocks sit in the window: gather (right before the recent "
        "blocks, in order), compact (gather, and the sink and control text too: the window's "
        "positions are contiguous) or original (their own positions, with gaps; needed with a "
        "quantized K cache whose head size is not a multiple of 64)", **_KVMEM,
    )  # fmt: skip
    cell_order: CellOrder = setting(
        CellOrder.FREE, "--kvmem-cell-order",
        help="where the window's blocks sit among the KV cells: free (the first free cells; "
        "the same KV, but the sums' order, and rarely a late greedy token, can depend on the "
        "session's history) or canonical (a turn starts with the window laid in the cells a "
        "fresh prefill of its prompt holds there: answers are a function of the request "
        "alone; it restores the blocks not already in those cells, and resumes at a chunk "
        "start)",
        **_KVMEM,
    )  # fmt: skip
    query_replay: QueryReplay = setting(
        QueryReplay.AUTO, "--kvmem-query-replay", help="replay the query after reselection",
        **_KVMEM,
    )  # fmt: skip
    query_policy: QueryPolicy = setting(
        QueryPolicy.AGENT, "--kvmem-query-policy",
        help="retrieval query: agent (the last user message and the live trajectory's tail), "
        "user (the last user message) or tail (the prompt's tail); without a user message "
        "(a raw prompt) the query is its question, the text after its last blank line "
        "(tail: the prompt's tail)", **_KVMEM,
    )  # fmt: skip
    query_max_tokens: int = _n(512, "--kvmem-query-max-tokens", "last N tokens of the query used")
    query_source: QuerySource = setting(
        QuerySource.MAIN, "--kvmem-query-source",
        help="where the query vectors come from: main (the main context's eval callback) or "
        "scoring (a second small context that decodes the sink and the query; the main "
        "context then runs without an eval callback, as stock llama.cpp)", **_KVMEM,
    )  # fmt: skip
    query_ahead: QueryAheadMode = setting(  # with the scoring source only
        QueryAheadMode.ON, "--kvmem-query-ahead",
        help="with --kvmem-query-source scoring: on computes the query rows and the block "
        "scores on a worker thread while the main context prefills, so the plan only "
        "picks; off computes them after the prefill", **_KVMEM,
    )  # fmt: skip
    control_tokens: int = _n(  # -1: budget / 4
        -1, "--kvmem-control-tokens",
        "bound of the control-text tier (system prompt, tool definitions)", "-1 = budget/4",
    )  # fmt: skip
    trajectory_tokens: int = _n(  # -1: budget / 4
        -1, "--kvmem-trajectory-tokens",
        "bound of the live-trajectory tier (tool calls and results after the task)",
        "-1 = budget/4",
    )  # fmt: skip
    stream_tokens: int = _n(  # -1: all the room a chunk leaves in the window
        -1, "--kvmem-stream-tokens",
        "bound of the newest tokens a prefill chunk sees besides sink and control (a "
        "narrower stream prefills faster over the budget: 1024 of a 4096 budget is 0.9x "
        "stock at the window, at a cost in fidelity)",
        "-1 = all the window leaves beside the chunk",
    )  # fmt: skip
    chunk_tokens: int = _n(
        CHUNK_TOKENS, "--kvmem-chunk-tokens",
        "prefill chunk with KVMem when -c exceeds the budget (at most -b; a context within "
        "the budget never streams and prefills in chunks of -b): a chunk over the budget "
        "sees its stream window and itself, so a smaller chunk leaves the stream more of "
        "the window",
        str(CHUNK_TOKENS),
    )  # fmt: skip
    harvest_tokens: int = _n(
        HARVEST_TOKENS, "--kvmem-harvest-tokens",
        "complete blocks wait on the GPU until this many tokens of them do, then go to the "
        "host in one state read (fewer GPU synchronisations in a prefill); always before an "
        "eviction, a reselection and the end of a turn. Costs host memory: the (pinned) "
        "staging buffer grows to hold that many tokens' KV, at most 1 GiB (8192 tokens of "
        "an 8B-shape model with q8_0 KV: 612 MiB); 0 = each decode's blocks at once", "8192",
    )  # fmt: skip
    restore_ahead: RestoreAheadMode = setting(
        RestoreAheadMode.GENERATION, "--kvmem-restore-ahead",
        help="when the copy threads build the next turn's stream restore: generation (from "
        "the prefill's end, beside the generation; the turn's end keeps the build when it "
        "predicts the same blocks) or turn-end (after the last token, in the client's pause "
        "alone: an agent's next request can come before it is done)", **_KVMEM,
    )  # fmt: skip
    recompute: RecomputeMode = setting(
        RecomputeMode.OFF, "--kvmem-recompute",
        help="retrieved blocks' KV: off (as the prefill stream computed it, beside the text "
        "around it in the history) or retrieved (each retrieved block decoded again in the "
        "chosen window, so that it sees the window's blocks as a short prompt's text sees "
        "what precedes it; costs a prefill of the retrieved tokens at every reselection "
        "past --kvmem-recompute-above; "
        "needs --kvmem-positions compact and the free cell order)", **_KVMEM,
    )  # fmt: skip
    recompute_above: float = setting(
        RECOMPUTE_ABOVE, "--kvmem-recompute-above",
        help="with --kvmem-recompute retrieved: only when the history is more than RATIO "
        "times --kvmem-budget (nearer the window, the stream's KV already saw much of what "
        "the window holds, and keeping it is closer to full context: docs/benchmarks.md "
        "Session 25); 0 = at every reselection",
        parse=float_in_range(0.0), metavar="RATIO", **_KVMEM,
    )  # fmt: skip
    stream_cap: int = _n(
        0, "--kvmem-stream-cap",
        "diagnostic: cap on the KV tokens a prefill chunk sees, whatever the capacity "
        "(the fidelity decomposition)", "0 = no cap",
    )  # fmt: skip
    rank: RankMode = setting(
        RankMode.SUMMARY, "--kvmem-rank",
        help="what ranks the retrieval candidates: summary (the block summaries, "
        "--kvmem-score-mode), exact (the exact attention mass of the query rows over "
        "every stored key: the fidelity oracle, CPU-heavy) or rerank (the summaries' best "
        "2x budget blocks reordered by their exact mass, normalized with the pinned tiers)",
        **_KVMEM,
    )  # fmt: skip
    lexical: LexicalMode = setting(
        LexicalMode.FUSE, "--kvmem-lexical",
        help="off, or fuse: the retrieval ranking fused (reciprocal rank) with BM25 over the "
        "token bigrams and trigrams of the task and the last message (terms in more than "
        "--kvmem-lexical-max-df of the blocks dropped), which finds the blocks holding the "
        "exact ids, names and numbers they name", **_KVMEM,
    )  # fmt: skip
    lexical_max_df: float = setting(
        MAX_DF_SHARE, "--kvmem-lexical-max-df",
        help="with --kvmem-lexical fuse: a term held by more than this share of the candidate "
        "blocks (and by more than 4) scores nothing, as the template's markup and stop "
        "phrases would; 0.1 suits --kvmem-block-tokens 64 (docs/benchmarks.md)",
        parse=float_in_range(0.0, 1.0), metavar="SHARE", **_KVMEM,
    )  # fmt: skip
    score_layers: tuple[int, ...] = setting(  # empty: layers spread over the depth
        (), "--kvmem-score-layers", help="attention layers used for scoring",
        parse=layer_list, metavar="L1,L2,...",
        shown="layers 1..n-1, 23 spread on deeper models", **_KVMEM,
    )  # fmt: skip
    # disk tier and restart-safe sessions (memory/tiered_store.py, engine/session_persist.py)
    disk_dir: str | None = setting(
        None, "--kvmem-disk-dir", help="disk tier and restart-safe session store", parse=str,
        metavar="DIR", shown="none, RAM only", **_KVMEM,
    )  # fmt: skip
    host_mib: int = _n(  # 0: unlimited
        0, "--kvmem-host-mib", "RAM cap of the block store in MiB; older blocks go to disk",
        "0 = no cap",
    )  # fmt: skip
    disk_mib: int = _n(0, "--kvmem-disk-mib", "disk cap of the block store in MiB", "0 = no cap")
    conversations: int = _n(  # sessions kept warm (engine/conversations.py)
        1, "--kvmem-conversations",
        "conversations kept warm in host memory; a request goes to the one sharing the "
        "longest prefix",
    )  # fmt: skip
    conversations_mib: int = _n(  # 0: no cap
        0, "--kvmem-conversations-mib",
        "cap in MiB on the conversations' stored blocks (RAM and disk); past it the least "
        "recently used conversation is evicted", "0 = no cap",
    )  # fmt: skip

    harness_overflow: HarnessOverflow = setting(
        HarnessOverflow.REJECT, "--kvmem-harness-overflow",
        help="Claude Code, OpenCode and Codex CLI requests pin their system prompt, tools "
        "and CLAUDE.md/AGENTS.md reminders on the GPU; when those cannot fit the budget: "
        "reject (HTTP 413 naming them) or fallback (no pinning)",
        **_KVMEM,
    )  # fmt: skip

    trace: bool = setting(  # the flag unset (None): KVMEM_TRACE decides
        False, "--kvmem-trace", help="print KVMEM_* trace records on stderr (also KVMEM_TRACE=1)",
        flag_default=None, negative=("--no-kvmem-trace",), shown="KVMEM_TRACE", **_KVMEM,
    )  # fmt: skip

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
        if self.neighbor_blocks < 0:
            raise ConfigError(
                "--kvmem-neighbor-blocks", f"must be >= 0, got {self.neighbor_blocks}"
            )
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
        _positive("--kvmem-chunk-tokens", self.chunk_tokens)
        if self.harvest_tokens < 0:
            raise ConfigError("--kvmem-harvest-tokens", f"must be >= 0, got {self.harvest_tokens}")
        if self.score_mlogits < 0:
            raise ConfigError("--kvmem-score-mlogits", f"must be >= 0, got {self.score_mlogits}")
        if self.score_threads < 0:
            raise ConfigError("--kvmem-score-threads", f"must be >= 0, got {self.score_threads}")
        if self.stream_cap < 0:
            raise ConfigError("--kvmem-stream-cap", f"must be >= 0, got {self.stream_cap}")
        if not 0.0 <= self.lexical_max_df <= 1.0:
            raise ConfigError(
                "--kvmem-lexical-max-df", f"must be in [0, 1], got {self.lexical_max_df}"
            )
        if self.lexical is LexicalMode.OFF and self.lexical_max_df != MAX_DF_SHARE:
            raise ConfigError("--kvmem-lexical-max-df", "applies to --kvmem-lexical fuse only")
        if any(layer < 0 for layer in self.score_layers):
            raise ConfigError("--kvmem-score-layers", "layer indices must be >= 0")
        if self.query_ahead is QueryAheadMode.OFF and self.query_source is not QuerySource.SCORING:
            raise ConfigError(
                "--kvmem-query-ahead",
                "applies to --kvmem-query-source scoring only (the main source captures its "
                "query during the prefill)",
            )
        self._validate_recompute()
        self._validate_disk_tier()

    def _validate_recompute(self) -> None:
        if self.recompute_above < 0:
            raise ConfigError(
                "--kvmem-recompute-above", f"must be >= 0, got {self.recompute_above}"
            )
        if self.recompute is RecomputeMode.OFF:
            if self.recompute_above != RECOMPUTE_ABOVE:
                raise ConfigError(
                    "--kvmem-recompute-above", "applies to --kvmem-recompute retrieved only"
                )
            return
        if self.positions is not PositionMode.COMPACT:
            raise ConfigError(
                "--kvmem-recompute",
                "needs --kvmem-positions compact (a block is decoded again right after the "
                "window's blocks before it, which must hold every lower position)",
            )
        if self.cell_order is CellOrder.CANONICAL:
            raise ConfigError(
                "--kvmem-recompute",
                "not with --kvmem-cell-order canonical (a block computed in one turn's window "
                "is not the block a fresh prefill holds)",
            )

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
            "stream": self.stream_tokens if self.stream_tokens >= 0 else self.gpu_cells,
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
