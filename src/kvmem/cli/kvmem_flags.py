"""The `--kvmem-*` and KV-cache-type flags, shared by kvmem-cli and kvmem-server.

Values are parsed by argparse with strict number types; the cross-field checks
(`KVMemConfig.validate`, `KVCacheTypes.validate`) run in `kvmem_config_from_args`,
before any model is loaded.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from enum import Enum

from kvmem.config import KVCacheTypes, KVMemConfig, QueryPolicy, QueryReplay
from kvmem.errors import ConfigError
from kvmem.memory.ggml_types import KV_TYPE_NAMES
from kvmem.memory.layout import PositionMode
from kvmem.memory.planner import RetrievalMethod
from kvmem.memory.scorer import ScoreAggregate, ScoreMode

_DEFAULTS = KVMemConfig()


def _choice_flag(group: argparse._ArgumentGroup, flag: str, default: Enum, help_text: str) -> None:
    """A flag whose values are the members of `default`'s Enum; help ends with the default."""
    group.add_argument(
        flag,
        choices=[m.value for m in type(default)],
        default=default.value,
        help=f"{help_text} (default: {default.value})",
    )


def strict_int(text: str) -> int:
    """An integer in plain decimal; rejects '1.5', '1e3', '' and trailing garbage."""
    value = text.strip()
    if not value or not value.lstrip("+-").isdigit():
        raise argparse.ArgumentTypeError(f"invalid integer value: {text!r}")
    return int(value)


def strict_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number: {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"invalid number: {text!r}")
    return value


def _layer_list(text: str) -> tuple[int, ...]:
    if text.strip().lower() in ("", "all"):
        return ()
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid layer list: {text!r}") from None


def add_kv_cache_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("KV cache")
    group.add_argument(
        "-ctk",
        "--cache-type-k",
        dest="cache_type_k",
        metavar="TYPE",
        default=None,
        help=f"K cache type: {', '.join(KV_TYPE_NAMES)} (default: f16)",
    )
    group.add_argument(
        "-ctv",
        "--cache-type-v",
        dest="cache_type_v",
        metavar="TYPE",
        default=None,
        help=f"V cache type: {', '.join(KV_TYPE_NAMES)} (default: f16)",
    )
    group.add_argument(
        "--kv-dtype",
        dest="kv_dtype",
        metavar="TYPE",
        default=None,
        help="set both K and V cache types",
    )


def add_kvmem_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("KVMem")
    group.add_argument(
        "--no-kvmem",
        dest="no_kvmem",
        action="store_true",
        help="plain llama.cpp with a full-size context (for comparison)",
    )
    group.add_argument(
        "--kvmem-budget",
        type=strict_int,
        default=_DEFAULTS.budget,
        metavar="N",
        help=f"GPU KV tokens for the selected working set (default: {_DEFAULTS.budget})",
    )
    group.add_argument(
        "--kvmem-gen-reserve",
        type=strict_int,
        default=_DEFAULTS.gen_reserve,
        metavar="N",
        help=f"GPU KV tokens reserved for new tokens (default: {_DEFAULTS.gen_reserve})",
    )
    group.add_argument(
        "--kvmem-block-tokens",
        type=strict_int,
        default=_DEFAULTS.block_tokens,
        metavar="N",
        help=f"tokens per block (default: {_DEFAULTS.block_tokens})",
    )
    group.add_argument(
        "--kvmem-sink-blocks",
        type=strict_int,
        default=_DEFAULTS.sink_blocks,
        metavar="N",
        help=f"blocks at the start always kept (default: {_DEFAULTS.sink_blocks})",
    )
    group.add_argument(
        "--kvmem-recent-blocks",
        type=strict_int,
        default=_DEFAULTS.recent_blocks,
        metavar="N",
        help=f"most recent blocks always kept (default: {_DEFAULTS.recent_blocks})",
    )
    _choice_flag(
        group,
        "--kvmem-method",
        _DEFAULTS.method,
        "block selection",
    )
    _choice_flag(
        group,
        "--kvmem-score-mode",
        _DEFAULTS.score_mode,
        "block summary scored against the query: bound (per-channel min/max, as in "
        "Quest) or mean (mean key)",
    )
    _choice_flag(
        group,
        "--kvmem-score-aggregate",
        _DEFAULTS.score_aggregate,
        "per-block score from the query rows' attention over blocks: mean (over tokens and "
        "heads) or max (the largest share any row gives the block)",
    )
    _choice_flag(
        group,
        "--kvmem-positions",
        _DEFAULTS.positions,
        "where retrieved blocks sit in the window: gather (right before the recent "
        "blocks, in order) or original (their own positions, with gaps)",
    )
    _choice_flag(
        group,
        "--kvmem-query-replay",
        _DEFAULTS.query_replay,
        "replay the query after reselection",
    )
    _choice_flag(
        group,
        "--kvmem-query-policy",
        _DEFAULTS.query_policy,
        "retrieval query: agent (the last user message and the live trajectory's tail), "
        "user (the last user message) or tail (the prompt's tail); without a user message "
        "the query is the prompt's tail",
    )
    group.add_argument(
        "--kvmem-query-max-tokens",
        type=strict_int,
        default=_DEFAULTS.query_max_tokens,
        metavar="N",
        help=f"last N tokens of the query used (default: {_DEFAULTS.query_max_tokens})",
    )
    for name, what, default in (
        ("control", "control-text tier (system prompt, tool definitions)", "budget/4"),
        ("trajectory", "live-trajectory tier (tool calls and results after the task)", "budget/4"),
        ("stream", "newest tokens a prefill chunk sees besides sink and control", "budget/2"),
    ):
        group.add_argument(
            f"--kvmem-{name}-tokens",
            type=strict_int,
            default=-1,
            metavar="N",
            help=f"bound of the {what} (default: -1 = {default})",
        )
    group.add_argument(
        "--kvmem-score-layers",
        type=_layer_list,
        default=(),
        metavar="L1,L2,...",
        help="attention layers used for scoring (default: layers 1..n-1, 23 spread on deeper models)",
    )
    group.add_argument(
        "--kvmem-disk-dir",
        default=None,
        metavar="DIR",
        help="disk tier and restart-safe session store (default: none, RAM only)",
    )
    group.add_argument(
        "--kvmem-host-mib",
        type=strict_int,
        default=0,
        metavar="N",
        help="RAM cap of the block store in MiB; older blocks go to disk (default: 0 = no cap)",
    )
    group.add_argument(
        "--kvmem-disk-mib",
        type=strict_int,
        default=0,
        metavar="N",
        help="disk cap of the block store in MiB (default: 0 = no cap)",
    )
    group.add_argument(
        "--kvmem-conversations",
        type=strict_int,
        default=1,
        metavar="N",
        help="conversations kept warm in host memory; a request goes to the one sharing "
        "the longest prefix (default: 1)",
    )
    # --kvmem-conversations-mib (engine/conversations.py: the pool's memory cap) ----------
    group.add_argument(
        "--kvmem-conversations-mib",
        type=strict_int,
        default=0,
        metavar="N",
        help="cap in MiB on the conversations' stored blocks (RAM and disk); past it the "
        "least recently used conversation is evicted (default: 0 = no cap)",
    )
    # end of --kvmem-conversations-mib -----------------------------------------------------
    group.add_argument(
        "--kvmem-trace",
        dest="kvmem_trace",
        action="store_true",
        default=None,
        help="print KVMEM_* trace records on stderr (also KVMEM_TRACE=1)",
    )
    group.add_argument(
        "--no-kvmem-trace",
        dest="kvmem_trace",
        action="store_false",
        help="disable trace records even when KVMEM_TRACE=1",
    )


@dataclass(frozen=True, slots=True)
class KVMemFlags:
    """What the shared flags resolve to."""

    kvmem: KVMemConfig
    cache_types: KVCacheTypes


def cache_types_from_args(ns: argparse.Namespace) -> KVCacheTypes:
    """Resolve -ctk/-ctv/--kv-dtype: --kv-dtype sets both, -ctk/-ctv override each component."""
    k = v = "f16"
    if ns.kv_dtype is not None:
        k = v = ns.kv_dtype
    if ns.cache_type_k is not None:
        k = ns.cache_type_k
    if ns.cache_type_v is not None:
        v = ns.cache_type_v
    k_flag = "-ctk" if ns.cache_type_k is not None else "--kv-dtype"
    v_flag = "-ctv" if ns.cache_type_v is not None else "--kv-dtype"
    return KVCacheTypes.from_names(k, v, k_flag, v_flag)


def kvmem_config_from_args(ns: argparse.Namespace, trace_env: bool = False) -> KVMemFlags:
    """Build and validate the KVMem settings; raises ConfigError naming the flag."""
    trace = trace_env if ns.kvmem_trace is None else ns.kvmem_trace
    config = KVMemConfig(
        enabled=not ns.no_kvmem,
        block_tokens=ns.kvmem_block_tokens,
        budget=ns.kvmem_budget,
        gen_reserve=ns.kvmem_gen_reserve,
        sink_blocks=ns.kvmem_sink_blocks,
        recent_blocks=ns.kvmem_recent_blocks,
        method=RetrievalMethod(ns.kvmem_method),
        query_replay=QueryReplay(ns.kvmem_query_replay),
        query_policy=QueryPolicy(ns.kvmem_query_policy),
        query_max_tokens=ns.kvmem_query_max_tokens,
        control_tokens=ns.kvmem_control_tokens,
        trajectory_tokens=ns.kvmem_trajectory_tokens,
        stream_tokens=ns.kvmem_stream_tokens,
        score_layers=ns.kvmem_score_layers,
        score_mode=ScoreMode(ns.kvmem_score_mode),
        score_aggregate=ScoreAggregate(ns.kvmem_score_aggregate),
        positions=PositionMode(ns.kvmem_positions),
        trace=trace,
        disk_dir=ns.kvmem_disk_dir,
        host_mib=ns.kvmem_host_mib,
        disk_mib=ns.kvmem_disk_mib,
        conversations=ns.kvmem_conversations,
        conversations_mib=ns.kvmem_conversations_mib,  # --kvmem-conversations-mib
    )
    config.validate()
    return KVMemFlags(kvmem=config, cache_types=cache_types_from_args(ns))


__all__ = [
    "ConfigError",
    "KVMemFlags",
    "add_kv_cache_arguments",
    "add_kvmem_arguments",
    "cache_types_from_args",
    "kvmem_config_from_args",
    "strict_float",
    "strict_int",
]
