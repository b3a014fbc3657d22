"""The free and total memory of the GPU llama.cpp would load onto, before any load.

Read through ggml's device API (`ggml_backend_dev_by_type`, `ggml_backend_dev_memory`)
from the libggml instances libllama links. A CPU-only build has no GPU device: None.
`--fit on` (kvmem.cli.fit_flags) sizes the KVMem window from it (kvmem.server.main hands
`gpu_free` to the settings).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

from . import llama_lib
from .rpc import _linked

_GPU_DEVICE = 1  # GGML_BACKEND_DEVICE_TYPE_GPU (ggml-backend.h)


@dataclass(frozen=True, slots=True)
class DeviceMemory:
    name: str
    free_bytes: int
    total_bytes: int


def gpu_memory() -> DeviceMemory | None:
    """The first GPU's memory as its backend reports it now (None: no GPU device)."""
    llama_lib.init_backend()
    lib, base = _linked("ggml"), _linked("ggml-base")
    lib.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
    lib.ggml_backend_dev_by_type.restype = ctypes.c_void_p
    device = lib.ggml_backend_dev_by_type(_GPU_DEVICE)
    if not device:
        return None
    size_p = ctypes.POINTER(ctypes.c_size_t)
    base.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, size_p, size_p]
    base.ggml_backend_dev_memory.restype = None
    base.ggml_backend_dev_name.argtypes = [ctypes.c_void_p]
    base.ggml_backend_dev_name.restype = ctypes.c_char_p
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    base.ggml_backend_dev_memory(device, ctypes.byref(free), ctypes.byref(total))
    name = (base.ggml_backend_dev_name(device) or b"").decode()
    return DeviceMemory(name, int(free.value), int(total.value))


def gpu_free() -> tuple[str, int] | None:
    """(the GPU's name, its free bytes), None without a GPU: --fit on's probe."""
    memory = gpu_memory()
    return None if memory is None else (memory.name, memory.free_bytes)
