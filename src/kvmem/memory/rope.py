"""RoPE and the Walsh-Hadamard KV rotation, as llama.cpp applies them, with their inverses.

Retrieval compares keys and queries in the *content frame*: with the rotary position
embedding removed, so that a block's mean key does not depend on where the block sits.

`apply_rope` is llama.cpp's `ggml_rope_ext` with ext_factor=0 and attn_factor=1:
theta_i(pos) = pos * freq_scale * freq_base ** (-2i / n_rot) / freq_factor_i for
i in [0, n_rot/2). NORM rotates the pairs (x[2i], x[2i+1]); NEOX rotates
(x[i], x[i + n_rot/2]). Dimensions from n_rot on pass through unchanged.

With a quantized K cache llama.cpp multiplies each post-RoPE key (and query) by an
orthonormal Hadamard matrix in chunks of `k_rotation_size(head_dim)` values before
storing it; `undo_hadamard` takes that back out.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from enum import Enum

import numpy as np

from kvmem.errors import MemoryLayoutError


class RopeType(Enum):
    """How the rotated dimensions are paired."""

    NORM = "norm"  # llama: (x[2i], x[2i+1])
    NEOX = "neox"  # (x[i], x[i + n_rot/2])


@dataclass(frozen=True, slots=True)
class RopeParams:
    """The rotary embedding of one model (all its attention layers)."""

    rope_type: RopeType
    n_rot: int  # rotated dimensions (<= head_dim); the rest pass through
    freq_base: float = 10000.0
    freq_scale: float = 1.0
    freq_factors: tuple[float, ...] | None = None  # per-pair divisors (llama3 rope_freqs), n_rot/2

    def __post_init__(self) -> None:
        if self.n_rot <= 0 or self.n_rot % 2:
            raise MemoryLayoutError(f"n_rot must be a positive even number, got {self.n_rot}")
        if self.freq_factors is not None and len(self.freq_factors) != self.n_rot // 2:
            raise MemoryLayoutError(
                f"{len(self.freq_factors)} freq_factors for n_rot={self.n_rot}; "
                f"expected {self.n_rot // 2}"
            )

    def angles(self, positions: np.ndarray) -> np.ndarray:
        """float64 [n_tokens, n_rot/2]: theta_i(pos) for every position."""
        half = self.n_rot // 2
        exponent = -2.0 * np.arange(half, dtype=np.float64) / self.n_rot  # [half]
        inv_freq = self.freq_scale * np.power(float(self.freq_base), exponent)  # [half]
        if self.freq_factors is not None:
            inv_freq = inv_freq / np.asarray(self.freq_factors, dtype=np.float64)  # [half]
        pos = np.asarray(positions, dtype=np.float64)  # [n_tokens]
        return pos[:, None] * inv_freq[None, :]  # [n_tokens, half]


def apply_rope(x: np.ndarray, positions: np.ndarray, params: RopeParams) -> np.ndarray:
    """Rotate x float32 [n_tokens, n_heads, head_dim] to `positions` int [n_tokens].

    Any number of middle axes is accepted (axis 0 is the token axis). Returns a new
    float32 array of x's shape; angles are computed in float64, products in float32.
    """
    return _rotate(x, positions, params, sign=1.0)


def remove_rope(x: np.ndarray, positions: np.ndarray, params: RopeParams) -> np.ndarray:
    """The inverse of `apply_rope`: rotate by -theta (same shapes and dtype)."""
    return _rotate(x, positions, params, sign=-1.0)


def _rotate(x: np.ndarray, positions: np.ndarray, params: RopeParams, sign: float) -> np.ndarray:
    pos = np.asarray(positions)  # [n_tokens]
    if x.ndim < 2 or pos.ndim != 1 or x.shape[0] != pos.shape[0]:
        raise MemoryLayoutError(
            f"x {list(x.shape)} and positions {list(pos.shape)} do not match: "
            "expected x [n_tokens, ..., head_dim] and positions [n_tokens]"
        )
    head_dim = x.shape[-1]
    if params.n_rot > head_dim:
        raise MemoryLayoutError(f"n_rot={params.n_rot} is larger than head_dim={head_dim}")
    theta = params.angles(pos)  # [n_tokens, half], float64: positions reach 2**18 rad
    bshape = (theta.shape[0],) + (1,) * (x.ndim - 2) + (theta.shape[1],)
    cos = np.cos(theta).astype(np.float32).reshape(bshape)  # [n_tokens, 1.., half]
    sin = (sign * np.sin(theta)).astype(np.float32).reshape(bshape)  # [n_tokens, 1.., half]
    src = np.ascontiguousarray(x, dtype=np.float32)  # [n_tokens, ..., head_dim]
    out = np.empty(src.shape, dtype=np.float32)  # [n_tokens, ..., head_dim]
    n_rot, half = params.n_rot, params.n_rot // 2
    out[..., n_rot:] = src[..., n_rot:]
    if params.rope_type is RopeType.NORM:  # adjacent pairs: one complex product
        turn = (cos + 1j * sin).astype(np.complex64)  # [n_tokens, 1.., half]
        out[..., :n_rot].view(np.complex64)[...] = src[..., :n_rot].view(np.complex64) * turn
        return out
    x0 = src[..., :half]  # [n_tokens, ..., half]: NEOX pairs value i with value i + half
    x1 = src[..., half:n_rot]  # [n_tokens, ..., half]
    out[..., :half] = x0 * cos - x1 * sin
    out[..., half:n_rot] = x0 * sin + x1 * cos
    return out


def hadamard_matrix(n: int) -> np.ndarray:
    """float32 [n, n]: H[i, j] = (-1)**popcount(i & j) / sqrt(n), n a power of two.

    Orthonormal and symmetric, so H @ H = I. A new (writable) array on every call.
    """
    return _hadamard(n).copy()


@functools.lru_cache(maxsize=8)
def _hadamard(n: int) -> np.ndarray:
    if n <= 0 or n & (n - 1):
        raise MemoryLayoutError(f"a Hadamard matrix needs a power of two, got {n}")
    h = np.ones((1, 1), dtype=np.float64)  # [1, 1]
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])  # Sylvester doubling
    out = (h / math.sqrt(n)).astype(np.float32)  # [n, n]
    out.setflags(write=False)
    return out


def k_rotation_size(head_dim: int) -> int:
    """The Hadamard chunk size llama.cpp uses for a quantized K cache, or 0 for none.

    llama.cpp rotates only when head_dim % 64 == 0 and then picks the largest power of
    two (>= 64) dividing head_dim: 64 -> 64, 128 -> 128, 192 -> 64, 256 -> 256, 96 -> 0.
    """
    if head_dim <= 0 or head_dim % 64:
        return 0
    nrot = 64
    while True:  # llama.cpp: do { nrot *= 2; } while (head_dim % nrot == 0); nrot /= 2;
        nrot *= 2
        if head_dim % nrot:
            break
    return nrot // 2


def undo_hadamard(x: np.ndarray, nrot: int) -> np.ndarray:
    """Apply H (its own inverse) to every chunk of `nrot` values along the last axis.

    x float32 [..., head_dim] with head_dim % nrot == 0; returns float32 of the same shape.
    """
    head_dim = x.shape[-1]
    if nrot <= 0 or head_dim % nrot:
        raise MemoryLayoutError(f"head_dim={head_dim} is not a multiple of nrot={nrot}")
    h = _hadamard(nrot)  # [nrot, nrot]
    rows = np.asarray(x, dtype=np.float32).reshape(-1, nrot)  # [n_chunks, nrot]
    return (rows @ h).reshape(x.shape)  # one GEMM: [..., head_dim]
