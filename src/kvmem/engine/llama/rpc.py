"""llama.cpp's RPC backend (ggml-rpc) through its public API, as llama.cpp's own tools use it.

A worker (`kvmem-rpc-worker`) calls `ggml_backend_rpc_start_server`; a host registers each
worker with `ggml_backend_rpc_add_server` (as llama-server's `--rpc`) and lists the remote
devices in the model's `devices`, before the local GPUs, as llama.cpp's default order
does. Both functions are found with `ggml_backend_reg_get_proc_address` on the "RPC"
registry entry, so a build without `-DGGML_RPC=on` is reported, not crashed on.

Once a process has registered a worker its devices stay in ggml's registry, so every model
load then names its devices explicitly (a local load gets the local GPUs only).

ggml-rpc aborts the process when a worker goes away mid-graph
(`GGML_ABORT("Remote RPC server crashed ...")`). `watch_workers` installs ggml's abort
callback: for that message it reports the lost worker and parks the calling (engine)
thread for good instead of returning into abort(), so the server stays up and answers
with the error; any other abort goes on as before.
"""

from __future__ import annotations

import ctypes
import logging
import os
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import llama_cpp
from llama_cpp._ctypes_extensions import load_shared_library

from kvmem.errors import RpcUnavailableError
from kvmem.settings.rpc_endpoints import LayerPlacement, RpcEndpoint

from . import llama_lib

logger = logging.getLogger(__name__)

_DEVICE_TYPE_CPU, _DEVICE_TYPE_GPU, _DEVICE_TYPE_ACCEL = 0, 1, 2  # enum ggml_backend_dev_type
_ADD_SERVER = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)
_START_SERVER = ctypes.CFUNCTYPE(
    None, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p
)
_ABORT_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_char_p)
_LOST_MARK = b"Remote RPC server"  # ggml-rpc.cpp RPC_STATUS_ASSERT's message
CONNECT_TIMEOUT_S = 5.0
NO_RPC_MESSAGE = (
    "this llama-cpp-python build has no RPC backend (libggml-rpc): rebuild it with "
    "CMAKE_ARGS=-DGGML_RPC=on (scripts/setup.sh does)"
)


def _linked(name: str) -> ctypes.CDLL:
    """The instance of lib<name> that libllama links (its soname, `lib<name>.so.0`): the
    wheel holds copies, not links, so `lib<name>.so` would be a second instance with its
    own backend registry and abort callback."""
    base_path = Path(llama_cpp.llama_cpp._base_path)
    linked = base_path / f"lib{name}.so.0"
    if linked.exists():
        return ctypes.CDLL(str(linked))
    return load_shared_library(name, base_path)


def _bind(lib: ctypes.CDLL, name: str, argtypes: list[object], restype: object) -> None:
    fn = getattr(lib, name)
    fn.argtypes = argtypes
    fn.restype = restype


class RpcLibrary:
    """The ggml backend registry calls the RPC backend needs (libggml, libggml-base)."""

    def __init__(self) -> None:
        llama_lib.init_backend()
        lib = _linked("ggml")
        vp, cp, sz = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t
        _bind(lib, "ggml_backend_reg_by_name", [cp], vp)
        _bind(lib, "ggml_backend_register", [vp], None)
        _bind(lib, "ggml_backend_dev_count", [], sz)
        _bind(lib, "ggml_backend_dev_get", [sz], vp)
        base = _linked("ggml-base")
        _bind(base, "ggml_backend_reg_get_proc_address", [vp, cp], vp)
        _bind(base, "ggml_backend_reg_name", [vp], cp)
        _bind(base, "ggml_backend_reg_dev_count", [vp], sz)
        _bind(base, "ggml_backend_reg_dev_get", [vp, sz], vp)
        _bind(base, "ggml_backend_dev_name", [vp], cp)
        _bind(base, "ggml_backend_dev_description", [vp], cp)
        _bind(base, "ggml_backend_dev_type", [vp], ctypes.c_int)
        _bind(base, "ggml_backend_dev_backend_reg", [vp], vp)
        _bind(base, "ggml_set_abort_callback", [_ABORT_CALLBACK], vp)
        self._lib, self._base = lib, base
        self._reg = lib.ggml_backend_reg_by_name(b"RPC")
        self._registered: dict[RpcEndpoint, list[int]] = {}  # endpoint -> its devices
        self._lock = threading.Lock()

    @property
    def available(self) -> bool:
        return bool(self._reg)

    def _proc(self, name: str) -> int:
        if not self._reg:
            raise RpcUnavailableError(NO_RPC_MESSAGE)
        address = self._base.ggml_backend_reg_get_proc_address(self._reg, name.encode())
        if not address:
            raise RpcUnavailableError(f"the RPC backend does not export {name}")
        return int(address)

    def add_workers(self, endpoints: tuple[RpcEndpoint, ...]) -> list[int]:
        """Register each worker once per process; its devices, in the order given."""
        add = _ADD_SERVER(self._proc("ggml_backend_rpc_add_server"))
        devices: list[int] = []
        with self._lock:
            for endpoint in endpoints:
                if endpoint not in self._registered:
                    check_reachable(endpoint)  # ggml-rpc aborts the process on a refused connect
                    reg = add(str(endpoint).encode())
                    if not reg:
                        raise RpcUnavailableError(f"the RPC worker {endpoint} reports no devices")
                    self._lib.ggml_backend_register(reg)
                    n = self._base.ggml_backend_reg_dev_count(reg)
                    self._registered[endpoint] = [
                        self._base.ggml_backend_reg_dev_get(reg, i) for i in range(n)
                    ]
                devices.extend(self._registered[endpoint])
        return devices

    @property
    def any_registered(self) -> bool:
        return bool(self._registered)

    def device_name(self, device: int) -> str:
        return (self._base.ggml_backend_dev_name(device) or b"").decode()

    def device_endpoints(self) -> dict[str, str]:
        """{device name: worker endpoint} of every registered RPC device."""
        return {
            self.device_name(dev): str(endpoint)
            for endpoint, devs in self._registered.items()
            for dev in devs
        }

    def local_devices(self, types: tuple[int, ...] = (_DEVICE_TYPE_GPU,)) -> list[int]:
        """The non-RPC devices of the given types, in registry order."""
        rpc_devices = {d for devs in self._registered.values() for d in devs}
        out: list[int] = []
        for i in range(self._lib.ggml_backend_dev_count()):
            dev = self._lib.ggml_backend_dev_get(i)
            if dev not in rpc_devices and self._base.ggml_backend_dev_type(dev) in types:
                out.append(dev)
        return out

    def start_server(self, endpoint: RpcEndpoint, cache_dir: str | None, n_threads: int) -> None:
        """Serve this machine's devices (its GPUs, else the CPU) until the process ends."""
        start = _START_SERVER(self._proc("ggml_backend_rpc_start_server"))
        devices = self.local_devices() or self.local_devices((_DEVICE_TYPE_CPU,))
        array = (ctypes.c_void_p * len(devices))(*devices)
        cache = cache_dir.encode() if cache_dir else None
        start(str(endpoint).encode(), cache, n_threads, len(devices), array)

    def set_abort_callback(self, callback: object) -> None:
        self._base.ggml_set_abort_callback(callback)


_library: RpcLibrary | None = None
_library_lock = threading.Lock()


def rpc_library() -> RpcLibrary:
    global _library
    with _library_lock:
        if _library is None:
            _library = RpcLibrary()
        return _library


def check_reachable(endpoint: RpcEndpoint) -> None:
    try:
        with socket.create_connection((endpoint.host, endpoint.port), CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        raise RpcUnavailableError(f"cannot reach the RPC worker {endpoint}: {exc}") from None


def model_devices(endpoints: tuple[RpcEndpoint, ...]) -> ctypes.Array[ctypes.c_void_p] | None:
    """The NULL-terminated `llama_model_params.devices` array: the workers' devices, then
    the local GPUs. None (llama.cpp's own choice) while no worker was ever registered."""
    if not endpoints and (_library is None or not _library.any_registered):
        return None
    lib = rpc_library()
    devices = lib.add_workers(endpoints) if endpoints else []
    devices += lib.local_devices()
    return (ctypes.c_void_p * (len(devices) + 1))(*devices, None)


@contextmanager
def captured_load_log(lines: list[str]) -> Iterator[None]:
    """Collect llama.cpp's log lines (all levels) into `lines` while forwarding them to the
    usual handler (llama_lib routes them into `logging`)."""
    forward = llama_lib._log_callback

    @llama_cpp.llama_log_callback
    def collect(level: int, text: bytes, user: ctypes.c_void_p) -> None:
        lines.append(text.decode("utf-8", "replace"))
        forward(level, text, user)

    llama_cpp.llama_log_set(collect, ctypes.c_void_p(0))
    try:
        yield
    finally:
        llama_cpp.llama_log_set(forward, ctypes.c_void_p(0))


def layer_placement(load_log: list[str]) -> LayerPlacement:
    endpoints = rpc_library().device_endpoints() if _library is not None else {}
    return LayerPlacement.from_log(load_log, endpoints)


_lost_handlers: list[Callable[[str], None]] = []
_abort_hook: object | None = None  # the installed ctypes callback (kept alive)


def watch_workers(on_lost: Callable[[str], None]) -> None:
    """Call `on_lost(message)` when a worker goes away mid-graph; the engine thread that
    met it then stays parked (see the module doc)."""
    global _abort_hook
    _lost_handlers.append(on_lost)
    if _abort_hook is not None:
        return

    @_ABORT_CALLBACK
    def hook(message: bytes | None) -> None:
        text = (message or b"").decode("utf-8", "replace")
        logger.critical("llama.cpp aborted: %s", text)
        if _LOST_MARK not in (message or b""):
            return  # abort() follows, as without the hook
        for handler in list(_lost_handlers):
            handler(text)
        threading.Event().wait()  # park this thread: returning would abort the process

    _abort_hook = hook
    rpc_library().set_abort_callback(hook)


def serve_worker(endpoint: RpcEndpoint, cache_dir: str | None, n_threads: int) -> None:
    """Start llama.cpp's RPC server on a daemon thread and wait for it (or Ctrl-C)."""
    library = rpc_library()
    if not library.available:
        raise RpcUnavailableError(NO_RPC_MESSAGE)
    if cache_dir is not None:
        os.makedirs(cache_dir, exist_ok=True)
    thread = threading.Thread(
        target=library.start_server, args=(endpoint, cache_dir, n_threads), daemon=True
    )
    thread.start()
    thread.join()  # the server only returns when it could not start or stopped accepting
    raise RpcUnavailableError(f"the RPC server on {endpoint} stopped (see its message above)")
