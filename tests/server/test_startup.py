"""kvmem-server's startup: validation before loading, bind failures, trace records, signals."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import LiveServer, free_port, run_server, start_server, wait_healthy


def test_help_lists_every_flag_with_defaults() -> None:
    result = run_server(["--usage"])
    assert result.returncode == 0
    for flag in (
        "--ctx-size",
        "--n-predict",
        "--api-key-file",
        "--kvmem-budget",
        "--chat-template-kwargs",
        "--reasoning-budget",
        "--no-webui",
        "--ui-dir",
        "--tensor-split",
        "LLAMA_ARG_CTX_SIZE",
    ):
        assert flag in result.stdout


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--embedding"], {}, "--embedding: embeddings and reranking are not offered"),
        (["--hf-repo", "x/y"], {}, "--hf-repo: kvmem-server never downloads models"),
        (["-c", "0"], {}, "argument -c/--ctx-size: 0 is out of range"),
        (
            ["-ctk", "q8_0", "-ctv", "f16"],
            {},
            "-ctk/-ctv: K/V cache types q8_0/f16 mix a float and a quantized type",
        ),
        (["--device", "CUDA0,CUDA1"], {}, "--device: multi-GPU operation is not supported"),
        ([], {"LLAMA_ARG_N_PREDICT": "-5"}, "LLAMA_ARG_N_PREDICT: -5 is out of range"),
        (["-n", "10"], {"LLAMA_ARG_N_PREDICT": "x"}, "LLAMA_ARG_N_PREDICT: invalid integer value"),
        (
            [],
            {"LLAMA_ARG_SSL_CERT_FILE": "/tmp/cert.pem"},
            "LLAMA_ARG_SSL_CERT_FILE: this API-key/TLS environment",
        ),
        (["-m", "/no/such/model.gguf"], {}, "--model: file not found: /no/such/model.gguf"),
    ],
)
def test_invalid_configuration_fails_before_loading(
    args: list[str], env: dict[str, str], message: str
) -> None:
    started = time.monotonic()
    result = run_server(args, env)
    assert result.returncode == 2
    assert f"kvmem-server: error: {message}" in result.stderr
    assert "Traceback" not in result.stderr
    assert time.monotonic() - started < 60


def test_bad_key_files_fail_startup(tmp_path: Path) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing here\n\n")
    result = run_server(["--api-key-file", str(empty)])
    assert (
        result.returncode == 2
        and f"--api-key-file: API key file {empty} holds no keys" in result.stderr
    )
    result = run_server([], {"LLAMA_ARG_API_KEY_FILE": str(tmp_path / "missing.txt")})
    assert (
        result.returncode == 2
        and "LLAMA_ARG_API_KEY_FILE: cannot read API key file" in result.stderr
    )
    result = run_server(["--api-key", "sk-good,bad key"])
    assert result.returncode == 2 and "--api-key: malformed API key" in result.stderr
    assert "bad key" not in result.stderr


def test_bind_failure_names_the_address_and_records_do_not_leak_keys() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        result = run_server(
            ["--port", str(port), "--api-key", "sk-very-secret", "--kvmem-trace"],
            {"LLAMA_ARG_FROBNICATE": "hidden-value"},
        )
    assert result.returncode == 1
    assert f"kvmem-server: error: cannot listen on 127.0.0.1:{port}" in result.stderr
    assert "listening on" not in result.stderr
    assert "ignoring unsupported environment variable LLAMA_ARG_FROBNICATE" in result.stderr
    assert "hidden-value" not in result.stderr and "sk-very-secret" not in result.stderr
    requested = re.search(r"^KVMEM_STARTUP requested=(\{.*\})$", result.stderr, re.M)
    assert requested is not None
    record = json.loads(requested.group(1))
    assert (record["port"], record["auth"], record["api_keys"]) == (port, "enabled", 1)
    assert record["sources"] == {"port": "cli"}
    assert "KVMEM_STARTUP ready=" not in result.stderr


@pytest.mark.parametrize("verbosity", ["0", "3"])
def test_a_file_that_is_not_a_loadable_model_exits_non_zero(tmp_path: Path, verbosity: str) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\x00" * 64)
    result = run_server(
        ["-m", str(broken), "--port", str(free_port()), "-lv", verbosity], timeout=180
    )
    assert result.returncode == 1
    assert result.stderr.endswith(
        f"kvmem-server: error: cannot load the model: llama.cpp failed to load the model {broken}\n"
    )
    # llama.cpp's own log goes through the same logger and follows -lv
    native = re.findall(r"^\S+ E llama_cpp\.native: (.*)$", result.stderr, re.M)
    if verbosity == "0":
        assert native == []
        assert result.stderr.count("\n") == 1
    else:
        assert "gguf_init_from_reader: bad GGUF version: 0" in native


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_mid_generation_stops_it_and_exits_cleanly(
    tmp_path: Path, sig: signal.Signals
) -> None:
    server = start_server(
        ["-c", "2048", "-t", "2", "-lv", "3"], tmp_path, env={"KVMEM_TRACE": "1"}, wait=False
    )
    try:
        _check_signal(server, sig)
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()


def _check_signal(server: LiveServer, sig: signal.Signals) -> None:
    wait_healthy(server)
    ready = re.search(r"^KVMEM_STARTUP ready=(\{.*\})$", server.log(), re.M)
    assert ready is not None
    record = json.loads(ready.group(1))
    assert (record["n_ctx"], record["port"], record["auth"], record["slots"]) == (
        2048,
        server.port,
        "disabled",
        1,
    )
    assert record["sources"] == {
        "ctx_size": "cli",
        "port": "cli",
        "threads": "cli",
        "verbosity": "cli",
    }
    body = {
        "messages": [{"role": "user", "content": "Write a very long poem."}],
        "stream": True,
        "max_tokens": 500,
        "temperature": 0,
    }
    with (
        httpx.Client(base_url=server.base_url, timeout=600) as http,
        http.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")
        next(lines)
        server.proc.send_signal(sig)
        rest = list(lines)
    try:
        code = server.proc.wait(60)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        raise
    assert code == 0
    assert "data: [DONE]" in rest
    generated = re.findall(r"^KVMEM_GEN tokens=(\d+) .*finish=(\w+)", server.log(), re.M)
    assert generated and generated[-1][1] == "cancelled" and int(generated[-1][0]) < 500
    assert "Traceback" not in server.log()
