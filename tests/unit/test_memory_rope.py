"""RoPE, its inverse and the Hadamard rotation against per-element loops."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvmem.errors import MemoryLayoutError
from kvmem.memory.rope import (
    RopeParams,
    RopeType,
    apply_rope,
    hadamard_matrix,
    k_rotation_size,
    remove_rope,
    undo_hadamard,
)


def _rope_loop(
    x: np.ndarray, positions: np.ndarray, params: RopeParams, sign: float = 1.0
) -> np.ndarray:
    """Plain-Python RoPE, one element pair at a time."""
    out = x.astype(np.float64).copy()  # [n_tokens, n_heads, head_dim]
    half = params.n_rot // 2
    for t in range(x.shape[0]):
        for h in range(x.shape[1]):
            for i in range(half):
                theta = (
                    int(positions[t])
                    * params.freq_scale
                    * params.freq_base ** (-2.0 * i / params.n_rot)
                )
                if params.freq_factors is not None:
                    theta /= params.freq_factors[i]
                c, s = math.cos(theta), sign * math.sin(theta)
                a, b = (2 * i, 2 * i + 1) if params.rope_type is RopeType.NORM else (i, i + half)
                x0, x1 = float(x[t, h, a]), float(x[t, h, b])
                out[t, h, a] = x0 * c - x1 * s
                out[t, h, b] = x0 * s + x1 * c
    return out.astype(np.float32)


_PARAMS = [
    RopeParams(RopeType.NORM, n_rot=16),
    RopeParams(RopeType.NEOX, n_rot=16),
    RopeParams(RopeType.NORM, n_rot=8, freq_base=500000.0, freq_scale=0.25),
    RopeParams(RopeType.NEOX, n_rot=12, freq_base=1e6, freq_scale=0.5),
    RopeParams(RopeType.NEOX, n_rot=8, freq_factors=(1.0, 2.0, 4.0, 8.0)),
]


@pytest.mark.parametrize("params", _PARAMS)
def test_apply_rope_matches_loop(params: RopeParams) -> None:
    rng = np.random.default_rng(params.n_rot)
    x = rng.standard_normal((5, 3, 16)).astype(np.float32)  # [n_tokens, n_heads, head_dim]
    positions = np.array([0, 1, 7, 130, 4095], dtype=np.int32)  # [n_tokens]
    got = apply_rope(x, positions, params)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, _rope_loop(x, positions, params), rtol=0, atol=1e-5)
    # dimensions from n_rot on pass through unchanged
    np.testing.assert_array_equal(got[..., params.n_rot :], x[..., params.n_rot :])
    np.testing.assert_allclose(
        remove_rope(x, positions, params),
        _rope_loop(x, positions, params, sign=-1.0),
        rtol=0,
        atol=1e-5,
    )


@pytest.mark.parametrize("params", _PARAMS)
def test_remove_inverts_apply(params: RopeParams) -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6, 2, 16)).astype(np.float32)  # [n_tokens, n_heads, head_dim]
    positions = np.array([3, 9, 100, 1000, 20000, 262143], dtype=np.int64)  # [n_tokens]
    roped = apply_rope(x, positions, params)
    np.testing.assert_allclose(remove_rope(roped, positions, params), x, rtol=0, atol=1e-5)
    assert not np.shares_memory(roped, x)


def test_position_zero_is_identity_and_input_untouched() -> None:
    x = np.arange(2 * 1 * 8, dtype=np.float32).reshape(2, 1, 8)  # [n_tokens, n_heads, head_dim]
    before = x.copy()
    got = apply_rope(x, np.zeros(2, dtype=np.int32), RopeParams(RopeType.NORM, n_rot=8))
    np.testing.assert_array_equal(got, x)
    np.testing.assert_array_equal(x, before)


def test_norm_rotates_adjacent_pair_by_hand() -> None:
    # n_rot = 2: one pair, theta = pos; NORM pairs (x0, x1), NEOX pairs (x0, x1) as well
    x = np.array([[[1.0, 0.0, 5.0, 6.0]]], dtype=np.float32)  # [1, 1, 4]
    got = apply_rope(x, np.array([1]), RopeParams(RopeType.NORM, n_rot=2))
    np.testing.assert_allclose(got[0, 0], [math.cos(1.0), math.sin(1.0), 5.0, 6.0], atol=1e-7)
    # NEOX with n_rot = 4 pairs (x0, x2) and (x1, x3)
    x = np.array([[[1.0, 0.0, 0.0, 0.0]]], dtype=np.float32)  # [1, 1, 4]
    got = apply_rope(x, np.array([2]), RopeParams(RopeType.NEOX, n_rot=4))
    np.testing.assert_allclose(got[0, 0], [math.cos(2.0), 0.0, math.sin(2.0), 0.0], atol=1e-7)


@pytest.mark.parametrize("rope_type", [RopeType.NORM, RopeType.NEOX])
def test_scores_depend_only_on_relative_position(rope_type: RopeType) -> None:
    params = RopeParams(rope_type, n_rot=32)
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 1, 32)).astype(np.float32)  # [1, 1, head_dim]
    k = rng.standard_normal((1, 1, 32)).astype(np.float32)  # [1, 1, head_dim]

    def dot(p_q: int, p_k: int) -> float:
        qr = apply_rope(q, np.array([p_q]), params)
        kr = apply_rope(k, np.array([p_k]), params)
        return float(np.dot(qr.ravel().astype(np.float64), kr.ravel().astype(np.float64)))

    base = dot(10, 3)
    for shift in (1, 57, 1000, 30000):
        assert dot(10 + shift, 3 + shift) == pytest.approx(base, abs=1e-4)
    assert dot(10, 4) != pytest.approx(base, abs=1e-3)


def test_extra_middle_axes_are_accepted() -> None:
    params = RopeParams(RopeType.NEOX, n_rot=8)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 2, 4, 8)).astype(
        np.float32
    )  # [n_tokens, n_layers, n_heads, head_dim]
    positions = np.array([5, 6, 700])  # [n_tokens]
    got = remove_rope(x, positions, params)
    for layer in range(2):
        np.testing.assert_array_equal(got[:, layer], remove_rope(x[:, layer], positions, params))


def test_invalid_rope_arguments() -> None:
    with pytest.raises(MemoryLayoutError):
        RopeParams(RopeType.NORM, n_rot=7)
    with pytest.raises(MemoryLayoutError):
        RopeParams(RopeType.NORM, n_rot=8, freq_factors=(1.0,))
    with pytest.raises(MemoryLayoutError):
        apply_rope(np.zeros((2, 1, 8), np.float32), np.zeros(3), RopeParams(RopeType.NORM, n_rot=8))
    with pytest.raises(MemoryLayoutError):
        apply_rope(
            np.zeros((2, 1, 8), np.float32), np.zeros(2), RopeParams(RopeType.NORM, n_rot=16)
        )


@pytest.mark.parametrize("n", [1, 2, 4, 64, 128])
def test_hadamard_matrix(n: int) -> None:
    h = hadamard_matrix(n)
    assert h.dtype == np.float32
    assert h.shape == (n, n)
    for i in range(n):
        for j in range(n):
            assert h[i, j] == np.float32((-1) ** bin(i & j).count("1") / math.sqrt(n))
    np.testing.assert_allclose(h.astype(np.float64) @ h.astype(np.float64), np.eye(n), atol=1e-6)
    h[0, 0] = 99.0  # the caller's copy is writable and does not leak into later calls
    assert hadamard_matrix(n)[0, 0] == np.float32(1 / math.sqrt(n))


def test_hadamard_needs_power_of_two() -> None:
    with pytest.raises(MemoryLayoutError):
        hadamard_matrix(96)


@pytest.mark.parametrize(
    ("head_dim", "nrot"),
    [(64, 64), (128, 128), (256, 256), (192, 64), (320, 64), (384, 128), (96, 0), (80, 0), (32, 0)],
)
def test_k_rotation_size(head_dim: int, nrot: int) -> None:
    assert k_rotation_size(head_dim) == nrot


def test_undo_hadamard_matches_chunk_loop() -> None:
    rng = np.random.default_rng(11)
    x = rng.standard_normal((3, 2, 192)).astype(np.float32)  # [n_tokens, n_heads, head_dim]
    h = hadamard_matrix(64)
    expected = np.zeros_like(x)
    for t in range(3):
        for head in range(2):
            for c in range(3):
                chunk = x[t, head, c * 64 : (c + 1) * 64].astype(np.float64)
                for i in range(64):
                    expected[t, head, c * 64 + i] = sum(
                        float(h[i, j]) * chunk[j] for j in range(64)
                    )
    got = undo_hadamard(x, 64)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)
    np.testing.assert_allclose(undo_hadamard(got, 64), x, rtol=0, atol=1e-5)
    with pytest.raises(MemoryLayoutError):
        undo_hadamard(x, 128)
