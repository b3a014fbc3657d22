"""`--fit on` (kvmem.cli.fit_flags): the fitted window equals the hand computation.

The model is a GGUF header written here (Llama-3-8B's shape: 32 layers x 8 KV heads x head
dim 4096/32 = 128); its weights are the file's bytes. KV per token in f16: K and V, each
32 x 8 x 128 elements x 2 bytes = 131072 B.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvmem.cli.fit_flags import FIT_RESERVE_FRACTION, FitFlags, FitMode, fit_engine, fit_plan
from kvmem.cli.server_config import load_server_settings
from kvmem.config import KVMemConfig
from kvmem.engine_settings import EngineSettings
from kvmem.errors import ConfigError
from tests.unit.test_launch_recipes import write_header

MIB = 1 << 20
PER_TOKEN = 2 * (32 * 8 * 128) * 2  # (K + V) x layers x KV heads x head dim x f16 bytes


@pytest.fixture()
def model(tmp_path: Path) -> str:
    path = write_header(
        tmp_path / "llama8b.gguf",
        "llama",
        block_count=32,
        **{"attention.head_count": 32, "attention.head_count_kv": 8},
        embedding_length=4096,
        context_length=8192,
    )
    return str(path)


def test_a_fitted_plan_equals_the_hand_computation(model: str) -> None:
    weights = os.path.getsize(model)
    flags = FitFlags(FitMode.ON, fit_target=512, gpu_mem=None)
    memory = weights + 512 * MIB + 3000 * PER_TOKEN + 1000  # room for 3000 cells
    engine = EngineSettings(model_path=model, n_ctx=16384)
    plan = fit_plan(engine, flags, 1, ("--gpu-mem", memory, True), 64 << 30)
    cells = 3000
    reserve = int(cells * FIT_RESERVE_FRACTION) // 128 * 128  # 333 -> 256
    budget = (cells - reserve) // 128 * 128  # 2744 -> 2688
    assert (reserve, budget) == (256, 2688)
    assert (plan.budget, plan.gen_reserve) == (budget, reserve)
    assert plan.kv_bytes_per_token == PER_TOKEN == 131072
    assert plan.weights_bytes == weights and plan.margin_bytes == 512 * MIB
    assert plan.host_ram_bytes == 64 << 30  # the KV is on the GPU: the host RAM is the store's
    assert plan.host_store_tokens == (64 << 30) // PER_TOKEN
    assert plan.lines[0] == f"memory: --gpu-mem {memory / MIB:.0f} MiB"


def test_lanes_split_the_memory_and_the_cpu_shares_the_host_ram(model: str) -> None:
    weights = os.path.getsize(model)
    flags = FitFlags(FitMode.ON, fit_target=0, gpu_mem=None)
    memory = weights + 4000 * PER_TOKEN  # two lanes: 2000 cells each
    engine = EngineSettings(model_path=model, n_ctx=16384)
    host = 8 << 30
    plan = fit_plan(engine, flags, 2, ("host RAM (no GPU)", memory, False), host)
    assert (plan.budget, plan.gen_reserve) == ((2000 - 128) // 128 * 128, 128)  # 1792, 128
    kv = 2 * (plan.budget + plan.gen_reserve) * PER_TOKEN
    assert plan.host_ram_bytes == host - weights - kv
    capped = fit_plan(engine, flags, 2, ("--gpu-mem", 1 << 40, True), host)
    assert capped.budget + capped.gen_reserve <= 16384 // 2  # a lane's context caps it


def test_too_little_memory_names_fit(model: str) -> None:
    flags = FitFlags(FitMode.ON, fit_target=1024, gpu_mem=None)
    engine = EngineSettings(model_path=model, n_ctx=8192)
    with pytest.raises(ConfigError, match="^--fit: 1.00 GiB leaves 0.00 GiB for KV"):
        fit_plan(engine, flags, 1, ("--gpu-mem", 1 << 30, True), 1 << 30)


def test_fit_off_keeps_the_window_and_refuses_its_own_flags(model: str) -> None:
    engine = EngineSettings(model_path=model, kvmem=KVMemConfig(budget=4096, gen_reserve=512))
    off = FitFlags()
    assert off.fit is FitMode.OFF
    assert fit_engine(engine, off, 1) == (engine, None)
    with pytest.raises(ConfigError, match="^--gpu-mem: applies with --fit on only"):
        fit_engine(engine, FitFlags(gpu_mem=1 << 30), 1)
    on = FitFlags(FitMode.ON, gpu_mem=1 << 30)
    with pytest.raises(ConfigError, match="^--fit: sizes --kvmem-budget itself"):
        fit_engine(engine, on, 1)
    defaults = EngineSettings(model_path=model)  # flags given with their default values
    with pytest.raises(ConfigError, match="^--fit: sizes --kvmem-gen-reserve itself"):
        fit_engine(defaults, on, 1, given=frozenset({"kvmem_gen_reserve"}))


def test_a_window_flag_given_with_its_default_value_is_refused_with_fit_on(model: str) -> None:
    argv = ["-m", model, "--fit", "on", "--gpu-mem", "4GiB"]
    for flag, value in (("--kvmem-budget", "32768"), ("--kvmem-gen-reserve", "4096")):
        with pytest.raises(ConfigError, match=f"^--fit: sizes {flag} itself"):
            load_server_settings([*argv, flag, value], {})
    settings, _ = load_server_settings(argv, {})
    assert settings.fit is not None and settings.engine.kvmem.budget == settings.fit.budget


def test_the_gpu_probe_gives_the_memory_and_the_window_is_set(model: str) -> None:
    weights = os.path.getsize(model)
    free = weights + 1024 * MIB + 3000 * PER_TOKEN

    def probe() -> tuple[str, int]:
        return "CUDA0", free

    engine = EngineSettings(model_path=model, n_ctx=16384)
    fitted, plan = fit_engine(engine, FitFlags(FitMode.ON), 1, probe)
    assert plan is not None and plan.memory_source == "CUDA0 free memory"
    assert (fitted.kvmem.budget, fitted.kvmem.gen_reserve) == (2688, 256)
    assert fitted.n_ctx == engine.n_ctx and fitted.model_path == model
