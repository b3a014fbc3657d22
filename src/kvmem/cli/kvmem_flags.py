"""The `--kvmem-*` and KV-cache-type flags, shared by kvmem-cli and kvmem-server.

The `--kvmem-*` flags are declared on `KVMemConfig`'s fields (kvmem.config), the cache
types on `KVCacheFlags`' (kvmem.cli.kv_cache_flags); `add_*_arguments` add them to any parser (the benchmarks use
them too). The cross-field checks (`KVMemConfig.validate`, `KVCacheTypes.validate`) run in
`kvmem_config_from_args`, before any model is loaded.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from kvmem.cli.flag_parser import add_flags
from kvmem.cli.flag_table import KV_CACHE_FLAGS, KVMEM_FLAGS, KVMEM_PREFIX
from kvmem.cli.kv_cache_flags import KVCacheFlags
from kvmem.config import KVCacheTypes, KVMemConfig
from kvmem.errors import ConfigError
from kvmem.settings import declared_fields, from_values
from kvmem.settings.values import strict_float, strict_int


def add_kv_cache_arguments(parser: argparse.ArgumentParser) -> None:
    add_flags(parser, KV_CACHE_FLAGS, fill_defaults=True)


def add_kvmem_arguments(parser: argparse.ArgumentParser) -> None:
    add_flags(parser, KVMEM_FLAGS, fill_defaults=True)


@dataclass(frozen=True, slots=True)
class KVMemFlags:
    """What the shared flags resolve to."""

    kvmem: KVMemConfig
    cache_types: KVCacheTypes


def cache_types_from_args(ns: argparse.Namespace) -> KVCacheTypes:
    return from_values(KVCacheFlags, ns).types()


def kvmem_config_from_args(ns: argparse.Namespace, trace_env: bool = False) -> KVMemFlags:
    """Build and validate the KVMem settings; raises ConfigError naming the flag."""
    trace = trace_env if ns.kvmem_trace is None else ns.kvmem_trace
    config: KVMemConfig = from_values(KVMemConfig, ns, KVMEM_PREFIX, trace=trace)
    config.validate()
    refuse_tuning_without_kvmem(config)
    return KVMemFlags(kvmem=config, cache_types=cache_types_from_args(ns))


# fields with a meaning under --no-kvmem: the switch itself and the trace (KVMEM_STARTUP)
_WITHOUT_KVMEM = frozenset({"enabled", "trace"})


def refuse_tuning_without_kvmem(config: KVMemConfig) -> None:
    """With --no-kvmem, a `--kvmem-*` flag set away from its default would be silently
    ignored: refuse it, naming the flag."""
    if config.enabled:
        return
    default = KVMemConfig()
    for name, row in declared_fields(KVMemConfig):
        if name not in _WITHOUT_KVMEM and getattr(config, name) != getattr(default, name):
            raise ConfigError(row.flags[0], "tunes KVMem, which --no-kvmem turns off: drop one")


__all__ = [
    "ConfigError",
    "KVMemFlags",
    "add_kv_cache_arguments",
    "add_kvmem_arguments",
    "cache_types_from_args",
    "kvmem_config_from_args",
    "refuse_tuning_without_kvmem",
    "strict_float",
    "strict_int",
]
