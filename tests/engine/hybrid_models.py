"""The tiny synthetic qwen35 hybrids for engine tests (written once per session, ~1 s each)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

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
