"""Whether llama.cpp can shift this model's K cache, read from the GGUF header before any
weights load.

`--kvmem-positions gather` and `compact` move blocks with `llama_memory_seq_add`, which
re-rotates the K cache. With a quantized K cache llama.cpp (0.3.36) builds that shift as
dequantize, Hadamard rotation, RoPE, rotation, quantize, and it reads the rotation matrix
without checking that it exists. The matrix exists only when the K head size is a multiple
of 64 and `LLAMA_ATTN_ROT_DISABLE` is unset; otherwise the first shift segfaults in
`llama_kv_cache::build_rope_shift` (a null dereference right after `ggml_cast`). Float K
caches rotate in place and never read it.
"""

from __future__ import annotations

import os

from kvmem.errors import ConfigError
from kvmem.gguf.kv_size import read_kv_geometry
from kvmem.memory.layout import PositionMode

ROTATION_MULTIPLE = 64  # llama.cpp builds the K rotation only for head sizes of this multiple
ROTATION_ENV = "LLAMA_ATTN_ROT_DISABLE"


def rotation_disabled() -> bool:
    """Whether the environment turns llama.cpp's attention rotation off (it reads atoi)."""
    value = os.environ.get(ROTATION_ENV, "").strip()
    return value.lstrip("+-").isdigit() and int(value) != 0


def check_quantized_k_shift(path: str, positions: PositionMode) -> None:
    """ConfigError naming --kvmem-positions unless llama.cpp can shift a quantized K cache
    of the model at `path` (only called for a quantized K cache and a mode that moves)."""
    why = None
    if rotation_disabled():
        why = f"{ROTATION_ENV} is set"
    elif (head := read_kv_geometry(path).head_dim_k) % ROTATION_MULTIPLE:
        why = f"this model's K head size is {head}, not a multiple of {ROTATION_MULTIPLE}"
    if why is not None:
        raise ConfigError(
            "--kvmem-positions",
            f"{positions.value} moves blocks, and llama.cpp crashes shifting a quantized K "
            f"cache when {why}: use --kvmem-positions original or a float K cache (-ctk f16)",
        )
