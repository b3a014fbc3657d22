"""ggml tensor types that a KV cache can hold, and their row layout."""

from __future__ import annotations

from enum import IntEnum

from kvmem.errors import ConfigError


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
