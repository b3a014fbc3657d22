"""dequantize_rows against hand-written decoders of ggml's block layouts."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from kvmem.errors import MemoryLayoutError
from kvmem.memory.ggml_types import GgmlType, dequantize_rows


def _f16(raw: bytes) -> float:
    return struct.unpack("<e", raw)[0]


def _ref_q8_0(block: bytes) -> list[float]:
    d = _f16(block[0:2])
    return [d * q for q in struct.unpack("<32b", block[2:34])]


def _ref_q4_0(block: bytes) -> list[float]:
    d = _f16(block[0:2])
    qs = block[2:18]
    low = [((byte & 0x0F) - 8) * d for byte in qs]
    high = [((byte >> 4) - 8) * d for byte in qs]
    return low + high


def _ref_q5_0(block: bytes) -> list[float]:
    d = _f16(block[0:2])
    (qh,) = struct.unpack("<I", block[2:6])
    qs = block[6:22]
    low, high = [], []
    for j in range(16):
        q_low = (qs[j] & 0x0F) | (((qh >> j) & 1) << 4)
        q_high = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)
        low.append((q_low - 16) * d)
        high.append((q_high - 16) * d)
    return low + high


_REFERENCE = {GgmlType.Q8_0: _ref_q8_0, GgmlType.Q4_0: _ref_q4_0, GgmlType.Q5_0: _ref_q5_0}


def _reference(rows: np.ndarray, ggml_type: GgmlType) -> np.ndarray:
    size = ggml_type.type_size
    out = []
    for row in rows:
        raw = row.tobytes()
        values: list[float] = []
        for start in range(0, len(raw), size):
            values.extend(_REFERENCE[ggml_type](raw[start : start + size]))
        out.append(values)
    return np.array(out, dtype=np.float32)  # [n_rows, n_elements]


def _random_quant_rows(
    rng: np.random.Generator, ggml_type: GgmlType, n_rows: int, n_elements: int
) -> np.ndarray:
    n_blocks = n_rows * n_elements // 32
    blocks = rng.integers(
        0, 256, size=(n_blocks, ggml_type.type_size), dtype=np.uint8
    )  # [n_blocks, type_size]
    scales = rng.uniform(-0.05, 0.05, size=n_blocks).astype(np.float16)  # [n_blocks]
    blocks[:, 0:2] = scales.view(np.uint8).reshape(n_blocks, 2)
    return blocks.reshape(n_rows, ggml_type.row_bytes(n_elements))  # [n_rows, row_bytes]


@pytest.mark.parametrize("ggml_type", [GgmlType.Q8_0, GgmlType.Q4_0, GgmlType.Q5_0])
def test_quantized_rows_match_reference_decoder(ggml_type: GgmlType) -> None:
    rng = np.random.default_rng(int(ggml_type))
    rows = _random_quant_rows(rng, ggml_type, n_rows=5, n_elements=96)
    got = dequantize_rows(rows, ggml_type, 96)
    assert got.dtype == np.float32
    assert got.shape == (5, 96)
    np.testing.assert_array_equal(got, _reference(rows, ggml_type))


def test_q4_0_nibble_order_by_hand() -> None:
    # d = 1.0; byte j holds element j (low nibble) and element j + 16 (high nibble)
    qs = bytes([(j & 0x0F) | (((15 - j) & 0x0F) << 4) for j in range(16)])
    block = np.frombuffer(struct.pack("<e", 1.0) + qs, dtype=np.uint8).reshape(1, 18)
    got = dequantize_rows(block, GgmlType.Q4_0, 32)
    expected = [j - 8 for j in range(16)] + [15 - j - 8 for j in range(16)]
    assert got[0].tolist() == expected


def test_q5_0_high_bits_by_hand() -> None:
    # d = 0.5, all nibbles 0, qh bit i set for even i: element i is (16*bit - 16) * 0.5
    qh = sum(1 << i for i in range(0, 32, 2))
    raw = struct.pack("<eI", 0.5, qh) + bytes(16)
    block = np.frombuffer(raw, dtype=np.uint8).reshape(1, 22)
    got = dequantize_rows(block, GgmlType.Q5_0, 32)
    assert got[0].tolist() == [0.0 if i % 2 == 0 else -8.0 for i in range(32)]


@pytest.mark.parametrize(
    ("ggml_type", "dtype"), [(GgmlType.F16, np.float16), (GgmlType.F32, np.float32)]
)
def test_float_rows(ggml_type: GgmlType, dtype: type) -> None:
    rng = np.random.default_rng(7)
    values = rng.standard_normal((4, 16)).astype(dtype)  # [4, 16]
    rows = values.view(np.uint8)  # [4, 16 * itemsize]
    got = dequantize_rows(rows, ggml_type, 16)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, values.astype(np.float32))
    assert not np.shares_memory(got, rows)


def test_non_contiguous_rows_are_decoded() -> None:
    values = np.arange(32, dtype=np.float16).reshape(4, 8)  # [4, 8]
    rows = values.view(np.uint8)[::2]  # [2, 16], every other row
    got = dequantize_rows(rows, GgmlType.F16, 8)
    assert got.tolist() == [list(range(0, 8)), list(range(16, 24))]


def test_empty_rows() -> None:
    rows = np.zeros((0, 34), dtype=np.uint8)  # [0, 34]
    got = dequantize_rows(rows, GgmlType.Q8_0, 32)
    assert got.shape == (0, 32)
    assert got.dtype == np.float32


def test_wrong_layout_is_rejected() -> None:
    with pytest.raises(MemoryLayoutError):
        dequantize_rows(np.zeros((2, 33), dtype=np.uint8), GgmlType.Q8_0, 32)
    with pytest.raises(MemoryLayoutError):
        dequantize_rows(np.zeros((2, 34), dtype=np.int8), GgmlType.Q8_0, 32)
    with pytest.raises(MemoryLayoutError):
        dequantize_rows(np.zeros(34, dtype=np.uint8), GgmlType.Q8_0, 32)
