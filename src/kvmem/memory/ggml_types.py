"""ggml tensor types that a KV cache can hold, their row layout, and decoding rows to float32."""

from __future__ import annotations

from enum import IntEnum

import numpy as np

from kvmem.errors import ConfigError, MemoryLayoutError


class GgmlType(IntEnum):
    """ggml's `enum ggml_type` values for the KV cache types KVMem supports."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q5_0 = 6
    Q8_0 = 8

    @property
    def label(self) -> str:
        return self.name.lower()

    @property
    def is_quantized(self) -> bool:
        return self not in (GgmlType.F32, GgmlType.F16)

    @property
    def block_size(self) -> int:
        """Elements per quantization block (1 for float types)."""
        return 1 if not self.is_quantized else 32

    @property
    def type_size(self) -> int:
        """Bytes per quantization block (per element for float types)."""
        return _TYPE_SIZE[self]

    def row_bytes(self, n_elements: int) -> int:
        """Bytes of one row of `n_elements` values (ggml_row_size)."""
        if n_elements % self.block_size:
            raise ValueError(f"{n_elements} elements is not a multiple of {self.block_size}")
        return n_elements // self.block_size * self.type_size


_TYPE_SIZE = {
    GgmlType.F32: 4,
    GgmlType.F16: 2,
    GgmlType.Q4_0: 18,  # f16 scale + 16 bytes of nibbles
    GgmlType.Q5_0: 22,  # f16 scale + 4 bytes of high bits + 16 bytes of nibbles
    GgmlType.Q8_0: 34,  # f16 scale + 32 int8
}

KV_TYPE_NAMES = tuple(t.label for t in GgmlType)


def parse_kv_type(name: str, flag: str) -> GgmlType:
    """Parse a KV cache type name (f16, f32, q8_0, q5_0, q4_0); ConfigError names `flag`."""
    try:
        return GgmlType[name.strip().upper()]
    except KeyError:
        raise ConfigError(
            flag, f"unknown KV cache type {name!r}; expected one of {', '.join(KV_TYPE_NAMES)}"
        ) from None


def dequantize_rows(rows: np.ndarray, ggml_type: GgmlType, n_elements: int) -> np.ndarray:
    """Decode KV rows stored in `ggml_type` to float32.

    rows: uint8 [n_rows, row_bytes] with row_bytes == ggml_type.row_bytes(n_elements).
    Returns float32 [n_rows, n_elements] (always a new array).
    """
    row_bytes = ggml_type.row_bytes(n_elements)
    if rows.dtype != np.uint8 or rows.ndim != 2 or rows.shape[1] != row_bytes:
        raise MemoryLayoutError(
            f"expected uint8 rows [n, {row_bytes}] of {ggml_type.label} x {n_elements}, "
            f"got {rows.dtype} {list(rows.shape)}"
        )
    n_rows = rows.shape[0]
    data = np.ascontiguousarray(rows)  # [n_rows, row_bytes]
    if ggml_type is GgmlType.F32:
        return data.view("<f4").astype(np.float32)  # [n_rows, n_elements]
    if ggml_type is GgmlType.F16:
        return data.view("<f2").astype(np.float32)  # [n_rows, n_elements]
    if n_rows == 0:
        return np.zeros((0, n_elements), dtype=np.float32)
    blocks = data.reshape(-1, ggml_type.type_size)  # [n_rows * n_elements / 32, type_size]
    values = _QUANTS[ggml_type](blocks)  # [n_blocks, 32]
    return values.reshape(n_rows, n_elements)  # [n_rows, n_elements]


def _scales(blocks: np.ndarray) -> np.ndarray:
    """float32 [n_blocks, 1]: each block's f16 scale (its first two bytes)."""
    return np.ascontiguousarray(blocks[:, :2]).view("<f2").astype(np.float32)


def _q8_0(blocks: np.ndarray) -> np.ndarray:
    """float32 [n_blocks, 32] of q8_0 blocks uint8 [n_blocks, 34]: d * int8."""
    return blocks[:, 2:].view(np.int8).astype(np.float32) * _scales(blocks)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """uint8 [n_blocks, 32] of packed bytes [n_blocks, 16]: the low nibbles, then the high."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def _q4_0(blocks: np.ndarray) -> np.ndarray:
    """float32 [n_blocks, 32] of q4_0 blocks uint8 [n_blocks, 18]: d * (nibble - 8)."""
    q = _nibbles(blocks[:, 2:]).astype(np.int8) - np.int8(8)  # [n_blocks, 32]
    return q.astype(np.float32) * _scales(blocks)


def _q5_0(blocks: np.ndarray) -> np.ndarray:
    """float32 [n_blocks, 32] of q5_0 blocks uint8 [n_blocks, 22]: d * (5-bit - 16); bit j of
    the 32-bit qh is the fifth bit of value j."""
    qh = np.ascontiguousarray(blocks[:, 2:6]).view("<u4")  # [n_blocks, 1]
    high = ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8) << 4  # [n_blocks, 32]
    q = (_nibbles(blocks[:, 6:]) | high).astype(np.int8) - np.int8(16)  # [n_blocks, 32]
    return q.astype(np.float32) * _scales(blocks)


_QUANTS = {GgmlType.Q8_0: _q8_0, GgmlType.Q4_0: _q4_0, GgmlType.Q5_0: _q5_0}
