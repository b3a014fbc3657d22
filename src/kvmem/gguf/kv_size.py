"""A model's KV bytes per token, from its GGUF header, and a KVMem budget sized to a GPU.

One sizing for both programs: kvmem-launch's `--gpu-mem SIZE` and kvmem-server's
`--fit on` (kvmem.cli.fit_flags) call `size_budget` with the weights' bytes of
`weights_bytes`.

Only the header is read (the `gguf` package): `<arch>.block_count`,
`<arch>.attention.head_count(_kv)`, `<arch>.embedding_length`,
`<arch>.attention.key_length` / `value_length`, and for hybrid models the per-layer
`head_count_kv` array (0 = a recurrent layer without KV) or `<arch>.full_attention_interval`.
`<arch>.nextn_predict_layers` > 0 means the model has an MTP head.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from kvmem.errors import ConfigError
from kvmem.memory.ggml_types import GgmlType

GIB = 1024**3
MIB = 1024**2


@dataclass(frozen=True, slots=True)
class KVGeometry:
    arch: str
    n_layer: int  # block_count
    n_kv_layers: int  # layers that hold a KV cache
    n_head_kv: int  # per KV layer (the largest, when the array varies)
    head_dim_k: int
    head_dim_v: int
    kv_elements_per_token: tuple[int, int]  # K and V elements per token over all KV layers
    mtp_layers: int  # nextn_predict_layers
    n_ctx_train: int

    @property
    def has_mtp_head(self) -> bool:
        return self.mtp_layers > 0

    def bytes_per_token(self, k_type: GgmlType, v_type: GgmlType) -> int:
        k_elems, v_elems = self.kv_elements_per_token
        return _bytes(k_type, k_elems) + _bytes(v_type, v_elems)


def _bytes(t: GgmlType, n: int) -> int:
    return n * t.type_size // t.block_size


def _field(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def read_kv_geometry(path: str) -> KVGeometry:
    """The KV shape of the GGUF model at `path`; ConfigError for a file without one."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path, "r")
    except (OSError, ValueError) as exc:
        raise ConfigError("MODEL", f"cannot read the GGUF header of {path}: {exc}") from None
    arch = _field(reader, "general.architecture")
    if not isinstance(arch, str):
        raise ConfigError("MODEL", f"{path} has no general.architecture")
    n_layer = _field(reader, f"{arch}.block_count")
    n_head = _field(reader, f"{arch}.attention.head_count")
    n_embd = _field(reader, f"{arch}.embedding_length")
    if not isinstance(n_layer, int) or n_head is None or not isinstance(n_embd, int):
        raise ConfigError("MODEL", f"{path} lacks {arch}.block_count/head_count/embedding_length")
    heads = n_head if isinstance(n_head, list) else [n_head] * n_layer
    kv = _field(reader, f"{arch}.attention.head_count_kv")
    kv_heads = kv if isinstance(kv, list) else [heads[0] if kv is None else kv] * n_layer
    interval = _field(reader, f"{arch}.full_attention_interval")
    if not isinstance(kv, list) and isinstance(interval, int) and interval > 1:
        # hybrid models: every `interval`-th layer is full attention, the rest recurrent
        kv_heads = [h if (i + 1) % interval == 0 else 0 for i, h in enumerate(kv_heads)]
    default_dim = n_embd // max(heads)
    dim_k = _field(reader, f"{arch}.attention.key_length") or default_dim
    dim_v = _field(reader, f"{arch}.attention.value_length") or default_dim
    kv_layers = [h for h in kv_heads if h > 0]
    n_ctx_train = _field(reader, f"{arch}.context_length") or 0
    return KVGeometry(
        arch=arch,
        n_layer=n_layer,
        n_kv_layers=len(kv_layers),
        n_head_kv=max(kv_layers, default=0),
        head_dim_k=int(dim_k),
        head_dim_v=int(dim_v),
        kv_elements_per_token=(sum(kv_layers) * int(dim_k), sum(kv_layers) * int(dim_v)),
        mtp_layers=int(_field(reader, f"{arch}.nextn_predict_layers") or 0),
        n_ctx_train=int(n_ctx_train),
    )


@dataclass(frozen=True, slots=True)
class Sizing:
    budget: int
    gen_reserve: int
    bytes_per_token: int
    kv_bytes: int  # what the chosen cells take
    reason: list[str]


def parse_size(text: str) -> int:
    """'16GiB', '16G', '12000MiB', '1.5GiB' -> bytes."""
    units = {"gib": GIB, "gb": GIB, "g": GIB, "mib": MIB, "mb": MIB, "m": MIB}
    lowered = text.strip().lower()
    for suffix in units:
        if lowered.endswith(suffix):
            number, scale = lowered[: -len(suffix)], units[suffix]
            break
    else:
        raise ConfigError("--gpu-mem", f"give a size with a unit (16GiB, 12000MiB): {text!r}")
    try:
        value = float(number)
    except ValueError:
        raise ConfigError("--gpu-mem", f"not a size: {text!r}") from None
    if not value > 0:
        raise ConfigError("--gpu-mem", f"must be positive: {text!r}")
    return int(value * scale)


def size_budget(
    gpu_bytes: int,
    weight_bytes: int,
    overhead_bytes: int,
    geometry: KVGeometry,
    k_type: GgmlType,
    v_type: GgmlType,
    *,
    block_tokens: int,
    reserve_fraction: float,
    max_cells: int,
    lanes: int = 1,
    flag: str = "--gpu-mem",
) -> Sizing:
    """Split the GPU memory left after weights and overhead into budget + generation reserve.

    Cells = free bytes // KV bytes per token // `lanes` (each lane is a context of its
    own), capped at `max_cells` (a lane's context); the reserve takes `reserve_fraction`
    of them; both are whole KVMem blocks. ConfigError names `flag` when too little is left."""
    per_token = geometry.bytes_per_token(k_type, v_type)
    if per_token <= 0:
        raise ConfigError(flag, "the model has no KV cache to size")
    free = gpu_bytes - weight_bytes - overhead_bytes
    cells = min(max(free, 0) // per_token // lanes, max_cells)
    reserve = int(cells * reserve_fraction) // block_tokens * block_tokens
    budget = (cells - reserve) // block_tokens * block_tokens
    if budget < 2 * block_tokens or reserve < block_tokens:
        raise ConfigError(
            flag,
            f"{gpu_bytes / GIB:.2f} GiB leaves {max(free, 0) / GIB:.2f} GiB for KV after "
            f"{weight_bytes / GIB:.2f} GiB of weights and {overhead_bytes / GIB:.2f} GiB of "
            f"overhead: too little for a KVMem window of {block_tokens}-token blocks",
        )
    kv_bytes = (budget + reserve) * per_token
    reason = [
        f"GPU {gpu_bytes / GIB:.2f} GiB - weights {weight_bytes / GIB:.2f} GiB (model file"
        f" size) - overhead {overhead_bytes / GIB:.2f} GiB = {max(free, 0) / GIB:.2f} GiB for KV",
        f"KV per token {per_token} B: {geometry.n_kv_layers} KV layers of {geometry.n_layer}"
        f" x {geometry.n_head_kv} KV heads x head dim {geometry.head_dim_k}/{geometry.head_dim_v}"
        f" (K {k_type.label}, V {v_type.label})",
        f"{cells} cells{f' per lane ({lanes} lanes)' if lanes > 1 else ''}"
        f"{' (capped at the context size)' if cells == max_cells else ''}:"
        f" gen reserve {reserve_fraction:.0%} -> {reserve}, budget {budget}"
        f" (multiples of {block_tokens}); KV {kv_bytes / GIB:.2f} GiB",
    ]
    return Sizing(budget, reserve, per_token, kv_bytes, reason)


def file_size(path: str) -> int:
    return os.path.getsize(path)


def weights_bytes(model_file: str, mmproj_file: str | None = None) -> int:
    """The bytes the weights take on the GPU: the model file's size, plus the projector's
    when it is offloaded too (None: not loaded or kept on the CPU)."""
    extra = file_size(mmproj_file) if mmproj_file and os.path.isfile(mmproj_file) else 0
    return file_size(model_file) + extra
