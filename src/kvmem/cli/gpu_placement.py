"""`--device`, `--split-mode`, `--main-gpu`, `--tensor-split` -> the engine's GpuPlacement.

kvmem-server runs on one GPU. `--device none` keeps every layer on the CPU; `--device
NAME<i>` (CUDA0, Vulkan1, ...) puts the model on device i (split mode none, main GPU i;
an explicit `--main-gpu` wins, with a warning when they differ). `--split-mode none|layer`
and `--main-gpu` go to llama.cpp's model parameters as they are; `--tensor-split` is passed
as given (at most one non-zero share, or one per device with `--rpc`: the workers' devices
come first). Multi-GPU settings are rejected earlier (server_config._check_gpu_options).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from kvmem.cli.server_flags import ModelFlags
from kvmem.engine_settings import GpuPlacement
from kvmem.errors import ConfigError

_DEVICE = re.compile(r"^[A-Za-z][A-Za-z_-]*?(\d+)$")


def gpu_placement(m: ModelFlags, sources: Mapping[str, str], warnings: list[str]) -> GpuPlacement:
    split_mode = m.split_mode.value
    main_gpu = m.main_gpu
    devices = m.device
    if devices and devices != ("none",):
        match = _DEVICE.match(devices[0])
        if match is None:
            raise ConfigError(
                "--device",
                f"unknown device {devices[0]!r}: use none or a backend device with its index, "
                "e.g. CUDA0",
            )
        index = int(match.group(1))
        split_mode = "none"
        if sources.get("main_gpu", "default") == "default":
            main_gpu = index
        elif main_gpu != index:
            warnings.append(f"--main-gpu {main_gpu} overrides the index of --device {devices[0]}")
    return GpuPlacement(
        split_mode=split_mode,
        main_gpu=main_gpu,
        tensor_split=m.tensor_split,
        rpc=m.rpc,  # --rpc: workers' devices first, as llama.cpp orders them
    )
