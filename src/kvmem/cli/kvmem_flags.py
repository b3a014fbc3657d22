"""The `--kvmem-*` and KV-cache-type flags, shared by kvmem-cli and kvmem-server.

The rows are in kvmem.cli.flag_table_kvmem; `add_*_arguments` add them to any parser
(the benchmarks use them too). The cross-field checks (`KVMemConfig.validate`,
`KVCacheTypes.validate`) run in `kvmem_config_from_args`, before any model is loaded.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from kvmem.cli.arg_types import strict_float, strict_int
from kvmem.cli.flag_parser import add_flags
from kvmem.cli.flag_table_kvmem import KV_CACHE_TABLE, KVMEM_TABLE
from kvmem.config import (
    KVCacheTypes,
    KVMemConfig,
    QueryAheadMode,
    QueryPolicy,
    QueryReplay,
    QuerySource,
)
from kvmem.errors import ConfigError
from kvmem.memory.exact_scorer import RankMode
from kvmem.memory.layout import PositionMode
from kvmem.memory.planner import RetrievalMethod
from kvmem.memory.scorer import ScoreAggregate, ScoreMode


def add_kv_cache_arguments(parser: argparse.ArgumentParser) -> None:
    add_flags(parser, KV_CACHE_TABLE, fill_defaults=True)


def add_kvmem_arguments(parser: argparse.ArgumentParser) -> None:
    add_flags(parser, KVMEM_TABLE, fill_defaults=True)


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
        query_source=QuerySource(ns.kvmem_query_source),
        query_ahead=QueryAheadMode(ns.kvmem_query_ahead),
        control_tokens=ns.kvmem_control_tokens,
        trajectory_tokens=ns.kvmem_trajectory_tokens,
        stream_tokens=ns.kvmem_stream_tokens,
        stream_cap=ns.kvmem_stream_cap,
        harvest_tokens=ns.kvmem_harvest_tokens,
        rank=RankMode(ns.kvmem_rank),
        score_layers=ns.kvmem_score_layers,
        score_mode=ScoreMode(ns.kvmem_score_mode),
        score_aggregate=ScoreAggregate(ns.kvmem_score_aggregate),
        score_mlogits=ns.kvmem_score_mlogits,
        score_threads=ns.kvmem_score_threads,
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
