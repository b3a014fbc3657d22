"""Startup diagnostics: log levels (`-lv`), listening socket, `KVMEM_STARTUP` records.

`-lv N`: 0 silent, 1 errors, 2 warnings, 3 normal (default), 4 adds llama.cpp's own
messages, 5 debug. llama.cpp's log arrives through the `llama_cpp.native` logger (the
engine routes it), so the same handler and levels apply.

With `--kvmem-trace` (or KVMEM_TRACE=1), `KVMEM_STARTUP requested={json}` is written to
stderr before the weights load and `KVMEM_STARTUP ready={json}` once the port is bound
and the model is loaded. The records hold settings, sources, the auth status and the key
count, never a key.
"""

from __future__ import annotations

import json
import logging
import socket
import sys
from typing import Any

from kvmem.chat.protocol import ModelInfoLike
from kvmem.server.props import served_model_id
from kvmem.server.rpc_status import rpc_body
from kvmem.server.settings import ServerSettings

LOG_FORMAT = "%(asctime)s.%(msecs)03d %(levelname).1s %(name)s: %(message)s"
_KVMEM_LEVELS = {
    0: logging.CRITICAL + 10,
    1: logging.ERROR,
    2: logging.WARNING,
    3: logging.INFO,
    4: logging.INFO,
    5: logging.DEBUG,
}
_LLAMA_LEVELS = {
    0: logging.CRITICAL + 10,
    1: logging.ERROR,
    2: logging.WARNING,
    3: logging.WARNING,
    4: logging.INFO,
    5: logging.DEBUG,
}


def configure_logging(verbosity: int, log_file: str | None = None) -> None:
    """One stderr handler for kvmem, llama.cpp and uvicorn, at the levels of `-lv`, and
    one appending to `log_file` (--log-file) when given; OSError if it cannot be opened."""
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file is not None:
        handlers.append(logging.FileHandler(log_file, encoding="utf-8"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    for handler in handlers:
        handler.setFormatter(logging.Formatter(LOG_FORMAT, datefmt="%H:%M:%S"))
        root.addHandler(handler)
    root.setLevel(_KVMEM_LEVELS[verbosity])
    logging.getLogger("kvmem").setLevel(_KVMEM_LEVELS[verbosity])
    logging.getLogger("llama_cpp").setLevel(_LLAMA_LEVELS[verbosity])
    uvicorn_level = (
        logging.INFO if verbosity >= 4 else max(logging.WARNING, _KVMEM_LEVELS[verbosity])
    )
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).setLevel(uvicorn_level)


def bind_socket(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """A listening socket on host:port (SO_REUSEPORT with `reuse_port`); OSError when the
    address cannot be bound."""
    host = host.strip("[]")  # an IPv6 literal may come bracketed
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def emit_record(kind: str, record: dict[str, Any]) -> None:
    sys.stderr.write(
        f"KVMEM_STARTUP {kind}={json.dumps(record, separators=(',', ':'), sort_keys=True)}\n"
    )
    sys.stderr.flush()


def _sources(settings: ServerSettings) -> dict[str, str]:
    return {k: s.value for k, s in sorted(settings.sources.items()) if s.value != "default"}


def _common_fields(settings: ServerSettings) -> dict[str, Any]:
    """Fields of both startup records: engine flags, auth (no key values) and sources."""
    e = settings.engine
    return {
        "batch": e.n_batch,
        "ubatch": e.n_ubatch,
        "threads": e.n_threads or "auto",
        "threads_batch": e.n_threads_batch or ("inherit" if e.n_threads else "auto"),
        "gpu_layers_requested": "all" if e.n_gpu_layers < 0 else e.n_gpu_layers,
        "flash_attn_requested": e.flash_attn,
        "n_predict": settings.n_predict,
        "kvmem": e.kvmem.enabled,
        "auth": "enabled" if settings.api_keys.enabled else "disabled",
        "api_keys": len(settings.api_keys.keys),
        "sources": _sources(settings),
    }


def requested_record(settings: ServerSettings) -> dict[str, Any]:
    e = settings.engine
    return {
        **_common_fields(settings),
        "model": e.model_path,
        "alias": settings.alias,
        "host": settings.host,
        "port": settings.port,
        "ctx_size": e.n_ctx or "model",
        "cache_type_k": e.cache_types.k.label,
        "cache_type_v": e.cache_types.v.label,
        "kvmem_budget": e.kvmem.budget,
        "kvmem_gen_reserve": e.kvmem.gen_reserve,
        "kvmem_block_tokens": e.kvmem.block_tokens,
        "vision": settings.mmproj is not None,
        "chat_template": settings.chat_template_origin,
        **_network_fields(settings),
    }


def _network_fields(settings: ServerSettings) -> dict[str, Any]:
    """-to/--timeout, --threads-http and the other connection bounds, as they apply."""
    lim = settings.limits
    return {
        "timeouts_s": {
            "header": lim.header_timeout_s,
            "body": lim.body_timeout_s,
            "write": lim.write_timeout_s,
            "keep_alive": lim.keep_alive_timeout_s,
        },
        "threads_http": lim.threads_http or "auto",
        "cors_origins": list(lim.cors_origins),
    }


def ready_record(settings: ServerSettings, info: ModelInfoLike, stats: Any) -> dict[str, Any]:
    return {
        **_common_fields(settings),
        "model": info.path,
        "model_id": served_model_id(settings, info),
        "host": settings.host,
        "port": settings.port,
        "n_ctx": info.n_ctx,
        "n_ctx_train": info.n_ctx_train,
        "max_output": "context" if settings.n_predict < 0 else settings.n_predict,
        "gpu_cells": getattr(stats, "gpu_cells_max", None),
        "vision": settings.mmproj is not None,
        "mtp": settings.engine.spec.wants_mtp,  # drafts from the model's MTP head
        "speculative": settings.engine.spec.describe(),
        "slots": settings.parallel,
        "queue_size": settings.queue_size,
        "rpc": rpc_body(settings, info),  # --rpc: workers and which layers live where
    }
