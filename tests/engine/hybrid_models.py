"""The tiny synthetic qwen35 hybrids for engine tests (written once per session, ~1 s each)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader

from kvmem.bench.synth_hybrid import QWEN35_TINY
from kvmem.bench.synth_model import WeightType, write_synthetic_model


def write_tiny_hybrid(directory: Path, nextn_layers: int = 0, seed: int = 0) -> Path:
    shape = dataclasses.replace(QWEN35_TINY, nextn_layers=nextn_layers)
    path = directory / f"qwen35-tiny-nextn{nextn_layers}-seed{seed}.gguf"
    write_synthetic_model(path, shape, WeightType.Q8_0, seed=seed, threads=2)
    return path


@pytest.fixture(scope="session")
def tiny_hybrid_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_hybrid(tmp_path_factory.mktemp("hybrid"))


def write_echo_head_hybrid(directory: Path, trunk_scale: float = 0.02, seed: int = 0) -> Path:
    """The tiny qwen35 with an MTP head that agrees with the trunk most of the time, so
    drafts are accepted deterministically (some, not all): the trunk's layer outputs
    (attn_output, ssm_out, ffn_down) are scaled by `trunk_scale`, so its next-token choice
    is mostly a function of the current token's embedding; the head's eh_proj passes the
    token embedding through ([I | 0]) and its attention and FFN outputs are zero, so it
    predicts from the draft token the same function. f32 weights, edited in place."""
    shape = dataclasses.replace(QWEN35_TINY, nextn_layers=1)
    path = directory / f"qwen35-tiny-echo-head-{trunk_scale}-seed{seed}.gguf"
    write_synthetic_model(path, shape, WeightType.F32, seed=seed, threads=2)
    reader = GGUFReader(str(path), "r+")
    head = f"blk.{shape.n_layer}."
    for tensor in reader.tensors:
        data = tensor.data  # [rows, cols], a writable view of the file
        if tensor.name.startswith(head):
            if tensor.name.endswith("nextn.eh_proj.weight"):  # [n_embd, 2 n_embd]
                data[:] = 0
                data[:, : data.shape[0]] = np.eye(data.shape[0], dtype=data.dtype)
            elif tensor.name.endswith(("attn_output.weight", "ffn_down.weight")):
                data[:] = 0
        elif tensor.name.endswith(("attn_output.weight", "ffn_down.weight", "ssm_out.weight")):
            data *= np.float32(trunk_scale)
    del reader  # flushes the memory map
    return path
