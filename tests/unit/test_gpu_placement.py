"""--device/--split-mode/--main-gpu/--tensor-split reach the engine's model parameters."""

from __future__ import annotations

import pytest

from kvmem.cli.server_config import load_server_settings
from kvmem.engine_settings import GpuPlacement
from kvmem.errors import ConfigError


def load(*argv: str):
    return load_server_settings(list(argv), {})


def test_defaults_are_llama_cpps() -> None:
    s, warnings = load()
    assert s.engine.placement == GpuPlacement(split_mode="layer", main_gpu=0, tensor_split=())
    assert warnings == []


def test_device_with_an_index_selects_that_gpu_alone() -> None:
    s, _ = load("--device", "CUDA1")
    assert s.engine.placement == GpuPlacement(split_mode="none", main_gpu=1)
    assert s.engine.n_gpu_layers == -1


def test_device_none_keeps_every_layer_on_the_cpu() -> None:
    s, _ = load("--device", "none")
    assert s.engine.n_gpu_layers == 0


def test_explicit_main_gpu_wins_over_the_device_index_with_a_warning() -> None:
    s, warnings = load("--device", "CUDA0", "--main-gpu", "2")
    assert s.engine.placement.main_gpu == 2
    assert warnings == ["--main-gpu 2 overrides the index of --device CUDA0"]


def test_split_mode_main_gpu_and_tensor_split_are_passed() -> None:
    s, _ = load("-sm", "none", "-mg", "3", "-ts", "0,1")
    assert s.engine.placement == GpuPlacement(
        split_mode="none", main_gpu=3, tensor_split=(0.0, 1.0)
    )
    env, _ = load_server_settings([], {"LLAMA_ARG_MAIN_GPU": "1", "LLAMA_ARG_SPLIT_MODE": "none"})
    assert env.engine.placement == GpuPlacement(split_mode="none", main_gpu=1)


def test_unknown_device_name_is_rejected_before_loading() -> None:
    with pytest.raises(ConfigError) as info:
        load("--device", "gpu")
    assert str(info.value) == (
        "--device: unknown device 'gpu': use none or a backend device with its index, e.g. CUDA0"
    )
