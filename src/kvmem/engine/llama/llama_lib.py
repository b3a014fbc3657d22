"""ctypes glue around llama-cpp-python: the one place that loads llama.cpp's libraries.

Besides `llama_cpp` itself this binds the few ggml functions the eval callback
needs (tensor name, op, shape, and reading a tensor's data from any backend),
and routes llama.cpp's own log through Python's logging.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from dataclasses import dataclass

import llama_cpp
import numpy as np
from llama_cpp import llama_cpp as lc  # noqa: F401  (re-exported for the engine)
from llama_cpp._ctypes_extensions import load_shared_library

from .host_staging import StagingBuffer

logger = logging.getLogger(__name__)
llama_log = logging.getLogger("llama_cpp.native")


class _TensorHead(ctypes.Structure):
    """The leading fields of `struct ggml_tensor` (ggml.h): type, buffer, ne, nb, op."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * 4),
        ("nb", ctypes.c_size_t * 4),
        ("op", ctypes.c_int),
    ]


@dataclass(frozen=True, slots=True)
class TensorView:
    """What the eval callback learns about a graph node."""

    name: str
    op: str
    ne: tuple[int, int, int, int]
    ggml_type: int


class GgmlBase:
    """Bindings to libggml-base from the llama_cpp package's lib directory."""

    def __init__(self) -> None:
        lib = load_shared_library("ggml-base", llama_cpp.llama_cpp._base_path)
        lib.ggml_get_name.argtypes = [ctypes.c_void_p]
        lib.ggml_get_name.restype = ctypes.c_char_p
        lib.ggml_op_name.argtypes = [ctypes.c_int]
        lib.ggml_op_name.restype = ctypes.c_char_p
        lib.ggml_nbytes.argtypes = [ctypes.c_void_p]
        lib.ggml_nbytes.restype = ctypes.c_size_t
        lib.ggml_backend_tensor_get.argtypes = [
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_size_t,
        ]
        lib.ggml_backend_tensor_get.restype = None
        self._lib = lib
        self._op_names: dict[int, str] = {}

    def name(self, tensor: int) -> bytes:
        return self._lib.ggml_get_name(tensor) or b""

    def view(self, tensor: int) -> TensorView:
        head = _TensorHead.from_address(tensor)
        return TensorView(
            name=self.name(tensor).decode("utf-8", "replace"),
            op=self.op_name(head.op),
            ne=tuple(int(x) for x in head.ne),  # type: ignore[arg-type]
            ggml_type=int(head.type),
        )

    def op_name(self, op: int) -> str:
        name = self._op_names.get(op)
        if name is None:
            name = self._lib.ggml_op_name(op).decode()
            self._op_names[op] = name
        return name

    def nbytes(self, tensor: int) -> int:
        return int(self._lib.ggml_nbytes(tensor))

    def op_of(self, tensor: int) -> str:
        return self.op_name(_TensorHead.from_address(tensor).op)

    def read_f32(self, tensor: int, into: np.ndarray | None = None) -> np.ndarray:
        """Copy an F32 tensor's data to the host, shaped as ggml's ne reversed: into fresh
        memory, or into the start of `into` (uint8, e.g. a page-locked buffer, which a GPU
        copies to at bus speed), returning a view of it."""
        head = _TensorHead.from_address(tensor)
        if head.type != 0:
            raise TypeError(f"expected an F32 tensor, got ggml type {head.type}")
        shape = tuple(int(x) for x in reversed(head.ne))
        n_bytes = 4 * int(np.prod(shape, dtype=np.int64))
        if into is None:
            out = np.empty(shape, dtype=np.float32)  # [ne3, ne2, ne1, ne0]
        else:
            out = into[:n_bytes].view(np.float32).reshape(shape)  # [ne3, ne2, ne1, ne0]
        self._lib.ggml_backend_tensor_get(tensor, out.ctypes.data_as(ctypes.c_void_p), 0, n_bytes)
        return out


_ggml: GgmlBase | None = None
_init_lock = threading.Lock()
_backend_ready = False


def ggml_base() -> GgmlBase:
    global _ggml
    with _init_lock:
        if _ggml is None:
            _ggml = GgmlBase()
        return _ggml


# llama.cpp log levels (ggml_log_level): 0 none, 1 debug, 2 info, 3 warn, 4 error, 5 cont
_LEVELS = {1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}
_last_level = [logging.INFO]


@llama_cpp.llama_log_callback
def _log_callback(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
    py_level = _LEVELS.get(level, _last_level[0])
    _last_level[0] = py_level
    message = text.decode("utf-8", "replace").rstrip("\n")
    if message and llama_log.isEnabledFor(py_level):
        llama_log.log(py_level, "%s", message)


def init_backend() -> None:
    """Initialise llama.cpp once per process and route its log into `logging`."""
    global _backend_ready
    with _init_lock:
        if _backend_ready:
            return
        llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
        _backend_ready = True


_GPU_DEVICE = 1  # GGML_BACKEND_DEVICE_TYPE_GPU (ggml-backend.h)


class HostBufferAllocator:
    """Page-locked host buffers from the GPU backend's host buffer type (cudaMallocHost on
    CUDA), through libggml's device API. `available` is False on a CPU-only build."""

    def __init__(self) -> None:
        lib = load_shared_library("ggml", llama_cpp.llama_cpp._base_path)
        lib.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
        lib.ggml_backend_dev_by_type.restype = ctypes.c_void_p
        lib.ggml_backend_dev_host_buffer_type.argtypes = [ctypes.c_void_p]
        lib.ggml_backend_dev_host_buffer_type.restype = ctypes.c_void_p
        lib.ggml_backend_buft_alloc_buffer.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        lib.ggml_backend_buft_alloc_buffer.restype = ctypes.c_void_p
        lib.ggml_backend_buffer_get_base.argtypes = [ctypes.c_void_p]
        lib.ggml_backend_buffer_get_base.restype = ctypes.c_void_p
        lib.ggml_backend_buffer_free.argtypes = [ctypes.c_void_p]
        lib.ggml_backend_buffer_free.restype = None
        self._lib = lib
        device = lib.ggml_backend_dev_by_type(_GPU_DEVICE)
        self._buft = lib.ggml_backend_dev_host_buffer_type(device) if device else None

    @property
    def available(self) -> bool:
        return bool(self._buft)

    def alloc(self, n_bytes: int) -> tuple[int, np.ndarray] | None:
        """(buffer handle, uint8 [n_bytes] array over its memory), or None on failure."""
        if not self._buft:
            return None
        handle = self._lib.ggml_backend_buft_alloc_buffer(self._buft, n_bytes)
        if not handle:
            return None
        base = self._lib.ggml_backend_buffer_get_base(handle)
        array = np.ctypeslib.as_array((ctypes.c_uint8 * n_bytes).from_address(base))  # [n]
        return handle, array

    def free(self, handle: int) -> None:
        self._lib.ggml_backend_buffer_free(handle)


_host_alloc: HostBufferAllocator | None = None


def pinned_staging(limit_bytes: int) -> StagingBuffer | None:
    """A reused page-locked buffer where the GPU backend offers a host buffer type; None
    on a CPU build (plain memory is then no faster than owned arrays)."""
    allocator = host_buffer_allocator()
    return StagingBuffer(allocator, limit_bytes) if allocator.available else None


def host_buffer_allocator() -> HostBufferAllocator:
    global _host_alloc
    with _init_lock:
        if _host_alloc is None:
            _host_alloc = HostBufferAllocator()
        return _host_alloc
