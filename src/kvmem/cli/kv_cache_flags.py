"""The KV cache type flags (-ctk/-ctv/--kv-dtype) of kvmem-cli and kvmem-server, declared
on `KVCacheFlags`' fields and resolved to the engine's `KVCacheTypes`."""

from __future__ import annotations

from dataclasses import dataclass

from kvmem.config import KVCacheTypes
from kvmem.memory.ggml_types import KV_TYPE_NAMES, parse_kv_type
from kvmem.settings import Group, Program, setting


def _kv_type_name(text: str) -> str:
    return parse_kv_type(text, "cache type").label


def _kv_type(names: tuple[str, ...], help_text: str, env: str | None) -> str | None:
    return setting(
        None, *names, help=help_text, parse=str, env=env, metavar="TYPE", shown="f16",
        programs=Program.BOTH, group=Group.KV_CACHE, env_parse=_kv_type_name,
    )  # fmt: skip


_TYPES = ", ".join(KV_TYPE_NAMES)


@dataclass(frozen=True, slots=True)
class KVCacheFlags:
    """-ctk/-ctv/--kv-dtype as given (None: not given), resolved by `types()`."""

    cache_type_k: str | None = _kv_type(
        ("-ctk", "--cache-type-k"), f"K cache type: {_TYPES}", "LLAMA_ARG_CACHE_TYPE_K"
    )
    cache_type_v: str | None = _kv_type(
        ("-ctv", "--cache-type-v"), f"V cache type: {_TYPES}", "LLAMA_ARG_CACHE_TYPE_V"
    )
    kv_dtype: str | None = _kv_type(("--kv-dtype",), "set both K and V cache types", None)

    def types(self) -> KVCacheTypes:
        """--kv-dtype sets both, -ctk/-ctv override each component."""
        k = v = self.kv_dtype or "f16"
        k_flag = v_flag = "--kv-dtype"
        if self.cache_type_k is not None:
            k, k_flag = self.cache_type_k, "-ctk"
        if self.cache_type_v is not None:
            v, v_flag = self.cache_type_v, "-ctv"
        return KVCacheTypes.from_names(k, v, k_flag, v_flag)
