"""apply_placement sets llama.cpp's model parameters from a GpuPlacement (no model is loaded)."""

from __future__ import annotations

import llama_cpp

from kvmem.engine.llama.model import apply_placement
from kvmem.engine_settings import GpuPlacement


def test_placement_sets_split_mode_main_gpu_and_tensor_split() -> None:
    params = llama_cpp.llama_model_default_params()
    placement = GpuPlacement(split_mode="none", main_gpu=2, tensor_split=(0.0, 1.0))
    keep = apply_placement(placement, params)
    assert params.split_mode == llama_cpp.LLAMA_SPLIT_MODE_NONE
    assert params.main_gpu == 2
    assert [params.tensor_split[i] for i in range(2)] == [0.0, 1.0]
    assert keep is not None


def test_default_placement_is_layer_split_on_gpu_0_without_shares() -> None:
    params = llama_cpp.llama_model_default_params()
    assert apply_placement(GpuPlacement(), params) is None
    assert (params.split_mode, params.main_gpu) == (llama_cpp.LLAMA_SPLIT_MODE_LAYER, 0)
    assert not params.tensor_split
