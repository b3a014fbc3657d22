"""Startup helpers: -lv levels, KVMEM_STARTUP records, the listening socket."""

from __future__ import annotations

import json
import logging
import socket

import pytest

from kvmem.cli.server_config import load_server_settings
from kvmem.server.startup import (
    bind_socket,
    configure_logging,
    emit_record,
    ready_record,
    requested_record,
)
from tests.fakes.engine import FakeInfo, FakeStats

SILENT = logging.CRITICAL + 10


@pytest.mark.parametrize(
    ("verbosity", "kvmem", "llama", "uvicorn"),
    [
        (0, SILENT, SILENT, SILENT),
        (1, logging.ERROR, logging.ERROR, logging.ERROR),
        (2, logging.WARNING, logging.WARNING, logging.WARNING),
        (3, logging.INFO, logging.WARNING, logging.WARNING),
        (4, logging.INFO, logging.INFO, logging.INFO),
        (5, logging.DEBUG, logging.DEBUG, logging.INFO),
    ],
)
def test_verbosity_levels(verbosity: int, kvmem: int, llama: int, uvicorn: int) -> None:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        configure_logging(verbosity)
        assert logging.getLogger("kvmem").level == kvmem
        assert logging.getLogger("llama_cpp").level == llama
        assert logging.getLogger("llama_cpp.native").getEffectiveLevel() == llama
        assert logging.getLogger("uvicorn.error").level == uvicorn
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        for name in ("kvmem", "llama_cpp", "uvicorn", "uvicorn.error", "uvicorn.access"):
            logging.getLogger(name).setLevel(logging.NOTSET)


def test_records_hold_settings_sources_and_key_count_only(
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings, _ = load_server_settings(
        ["-c", "4096", "--api-key", "sk-a,sk-b", "-t", "3"],
        {"LLAMA_ARG_BATCH": "256", "LLAMA_ARG_UBATCH": "128"},
    )
    record = requested_record(settings)
    assert record == {
        "model": None,
        "alias": None,
        "host": "127.0.0.1",
        "port": 8080,
        "ctx_size": 4096,
        "batch": 256,
        "ubatch": 128,
        "threads": 3,
        "threads_batch": 3,
        "gpu_layers_requested": "all",
        "flash_attn_requested": True,
        "n_predict": -1,
        "cache_type_k": "f16",
        "cache_type_v": "f16",
        "kvmem": True,
        "kvmem_budget": 32768,
        "kvmem_gen_reserve": 4096,
        "kvmem_block_tokens": 128,
        "vision": False,
        "chat_template": "gguf",
        "timeouts_s": {"header": 10.0, "body": 60.0, "write": 600.0, "keep_alive": 5.0},
        "threads_http": "auto",
        "cors_origins": [],
        "auth": "enabled",
        "api_keys": 2,
        "sources": {"batch_size": "env", "ctx_size": "cli", "threads": "cli", "ubatch_size": "env"},
    }
    ready = ready_record(settings, FakeInfo(n_ctx=4096), FakeStats(gpu_cells_max=4096))
    assert (
        ready["n_ctx"],
        ready["n_ctx_train"],
        ready["model_id"],
        ready["gpu_cells"],
        ready["api_keys"],
    ) == (4096, 8192, "fake-model.gguf", 4096, 2)
    emit_record("requested", record)
    line = capsys.readouterr().err
    assert line.startswith("KVMEM_STARTUP requested={") and line.endswith("}\n")
    assert json.loads(line.split("=", 1)[1]) == record
    assert "sk-a" not in line


def test_bind_socket_and_its_failure() -> None:
    sock = bind_socket("127.0.0.1", 0)
    try:
        port = sock.getsockname()[1]
        with pytest.raises(OSError):
            bind_socket("127.0.0.1", port)
    finally:
        sock.close()
    assert isinstance(sock, socket.socket)
