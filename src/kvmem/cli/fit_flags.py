"""`--fit on`: the KVMem window sized to the machine (llama-server's `--fit` spelling).

With `--fit on`, `--kvmem-budget` and `--kvmem-gen-reserve` come from the memory left on
the GPU after the weights and a margin: the GPU's free memory as llama.cpp's backend
reports it before the load, or `--gpu-mem SIZE` (on a CPU-only build without it, the
host's available RAM). The split is kvmem-launch's `--gpu-mem` sizing (kvmem.gguf.kv_size):
cells = (memory - weights - `--fit-target` MiB) // KV bytes per token // lanes, capped at
a lane's context; the generation reserve takes the default window's share (4096 of
32768 + 4096), both whole blocks. The plan also says how many tokens of history the host
RAM left holds in the block store. It is logged at startup and shown in /props
(`kvmem.fit`). `--fit off` (the default) keeps the flags' values.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import asdict, dataclass, replace
from enum import Enum
from typing import Any, Protocol

from kvmem.config import KVMemConfig
from kvmem.engine_settings import EngineSettings
from kvmem.errors import ConfigError, ModelNotFoundError
from kvmem.gguf.kv_size import MIB, parse_size, read_kv_geometry, size_budget, weights_bytes
from kvmem.gguf.model_path import resolve_model_path
from kvmem.settings import Group, setting
from kvmem.settings import values as t

FIT_RESERVE_FRACTION = 4096 / (32768 + 4096)  # the default window's generation share
_FIT = {"group": Group.KVMEM}


class FitMode(Enum):
    ON = "on"
    OFF = "off"


def memory_size(text: str) -> int:
    """'16GiB', '12000MiB' -> bytes (an argparse value parser)."""
    try:
        return parse_size(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--gpu-mem: ")) from None


@dataclass(frozen=True, slots=True)
class FitFlags:
    fit: FitMode = setting(
        FitMode.OFF, "--fit",
        help="on: size --kvmem-budget and --kvmem-gen-reserve to the GPU memory left after "
        "the weights (--gpu-mem, else the GPU's free memory; the plan is in /props)",
        env="LLAMA_ARG_FIT", **_FIT,
    )  # fmt: skip
    fit_target: int = setting(
        1024, "--fit-target", help="MiB of GPU memory --fit leaves free (compute buffers)",
        parse=t.int_in_range(0, 1 << 20), env="LLAMA_ARG_FIT_TARGET", metavar="MiB", **_FIT,
    )  # fmt: skip
    gpu_mem: int | None = setting(
        None, "--gpu-mem", help="GPU memory --fit sizes for (16GiB, 12000MiB)",
        parse=memory_size, metavar="SIZE",
        shown="the GPU's free memory; without a GPU the host's available RAM", **_FIT,
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class FitPlan:
    """What --fit decided, and from what (bytes and tokens)."""

    memory_source: str  # "--gpu-mem", the GPU's name, or "host RAM (no GPU)"
    memory_bytes: int
    weights_bytes: int
    margin_bytes: int  # --fit-target
    kv_bytes_per_token: int
    lanes: int
    budget: int
    gen_reserve: int
    host_ram_bytes: int  # available for the host block store
    host_store_tokens: int  # the history those bytes hold
    lines: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        body = asdict(self)
        body["lines"] = list(self.lines)
        return body


def host_available_bytes() -> int:
    """MemAvailable from /proc/meminfo (else the free pages)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


class GpuProbe(Protocol):
    """The GPU llama.cpp would load onto: (its name, free bytes), None without one
    (kvmem.engine.llama.device_memory, handed in by the server)."""

    def __call__(self) -> tuple[str, int] | None: ...


def _device_memory(flags: FitFlags, probe: GpuProbe | None) -> tuple[str, int, bool]:
    """(source, bytes, on a GPU): --gpu-mem, the GPU's free memory, or the host's RAM."""
    gpu = probe() if probe is not None else None
    if flags.gpu_mem is not None:
        return "--gpu-mem", flags.gpu_mem, gpu is not None
    if gpu is not None:
        return f"{gpu[0]} free memory", gpu[1], True
    return "host RAM (no GPU)", host_available_bytes(), False


def fit_plan(
    engine: EngineSettings,
    flags: FitFlags,
    lanes: int,
    memory: tuple[str, int, bool],
    host_bytes: int,
) -> FitPlan:
    """The window for `memory` = (source, bytes, whether the KV lives on a GPU)."""
    try:
        model = resolve_model_path(engine.model_path)
    except ModelNotFoundError as exc:
        raise ConfigError("--fit", str(exc)) from None
    geometry = read_kv_geometry(model)
    vision = engine.vision
    mmproj = vision.mmproj if vision is not None and vision.offload else None
    weights = weights_bytes(model, mmproj)
    source, total, on_gpu = memory
    n_ctx = engine.n_ctx or geometry.n_ctx_train or 1 << 30
    kv = engine.kvmem
    sizing = size_budget(
        total,
        weights,
        flags.fit_target * MIB,
        geometry,
        engine.cache_types.k,
        engine.cache_types.v,
        block_tokens=kv.block_tokens,
        reserve_fraction=FIT_RESERVE_FRACTION,
        max_cells=max(1, n_ctx // lanes),
        lanes=lanes,
        flag="--fit",
    )
    used = 0 if on_gpu else weights + sizing.kv_bytes * lanes  # on the CPU: the same RAM
    host = max(0, host_bytes - used)
    store_tokens = host // sizing.bytes_per_token
    lines = (
        f"memory: {source} {total / MIB:.0f} MiB",
        *sizing.reason,
        f"host RAM for the block store: {host / MIB:.0f} MiB = {store_tokens} tokens of history",
    )
    return FitPlan(
        source, total, weights, flags.fit_target * MIB, sizing.bytes_per_token, lanes,
        sizing.budget, sizing.gen_reserve, host, store_tokens, lines,
    )  # fmt: skip


_WINDOW_FLAGS = (("kvmem_budget", "--kvmem-budget"), ("kvmem_gen_reserve", "--kvmem-gen-reserve"))


def fit_engine(
    engine: EngineSettings,
    flags: FitFlags,
    lanes: int,
    probe: GpuProbe | None = None,
    given: frozenset[str] = frozenset(),
) -> tuple[EngineSettings, FitPlan | None]:
    """The engine's settings with the fitted window (unchanged with --fit off). A window
    flag that was given (`given`: the flags' dests set on the command line or in the
    environment) or differs from its default is refused with --fit on: it would be
    overridden."""
    if flags.fit is FitMode.OFF:
        if flags.gpu_mem is not None:
            raise ConfigError("--gpu-mem", "applies with --fit on only")
        return engine, None
    kv, default = engine.kvmem, KVMemConfig()
    for (dest, flag), value, unset in zip(
        _WINDOW_FLAGS,
        (kv.budget, kv.gen_reserve),
        (default.budget, default.gen_reserve),
        strict=True,
    ):
        if dest in given or value != unset:
            raise ConfigError("--fit", f"sizes {flag} itself: drop {flag} or use --fit off")
    if not engine.kvmem.enabled:
        raise ConfigError("--fit", "sizes the KVMem window: drop --no-kvmem")
    plan = fit_plan(engine, flags, lanes, _device_memory(flags, probe), host_available_bytes())
    kvmem = replace(engine.kvmem, budget=plan.budget, gen_reserve=plan.gen_reserve)
    kvmem.validate()
    return replace(engine, kvmem=kvmem), plan
