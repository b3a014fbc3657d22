"""Live server fixtures: real `kvmem-server` processes with SmolLM2-135M-Instruct.

The machine has two cores, so servers are session-scoped and shared: `main_server` (no
keys; `-c 8192 --kvmem-budget 1024` so long conversations exceed the budget) and
`auth_server` (CLI, file and environment keys). Each waits on /health before use and is
stopped with SIGTERM at the end, which must exit 0.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

STARTUP_TIMEOUT_S = 300.0
REQUEST_TIMEOUT_S = 600.0
MAIN_ARGS = (
    "-c",
    "8192",
    "--kvmem-budget",
    "1024",
    "--kvmem-gen-reserve",
    "512",
    "--metrics",
    "--alias",
    "smol",
    "-t",
    "2",
    "--kvmem-trace",
)
AUTH_KEYS_CLI = "sk-cli-1,sk-cli-2"
AUTH_KEY_FILE = "sk-file-1"
AUTH_KEY_ENV = "sk-env-1"


def server_command() -> list[str]:
    script = Path(sys.executable).with_name("kvmem-server")
    if script.exists():
        return [str(script)]
    found = shutil.which("kvmem-server")
    return [found] if found else [sys.executable, "-m", "kvmem.server.main"]


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The test environment without any LLAMA_ARG_*/key/trace variables, plus `extra`."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("LLAMA_ARG_", "LLAMA_API_")) and k != "KVMEM_TRACE"
    }
    env.update(extra or {})
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class LiveServer:
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, api_key: str = "no-key", max_retries: int = 0) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=self.base_url + "/v1",
            api_key=api_key,
            timeout=REQUEST_TIMEOUT_S,
            max_retries=max_retries,
        )

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, timeout=REQUEST_TIMEOUT_S)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(
                    f"kvmem-server did not exit on SIGTERM; log:\n{self.log()[-3000:]}"
                ) from None
        return self.proc.returncode


def start_server(
    args: Sequence[str], log_dir: Path, env: Mapping[str, str] | None = None, wait: bool = True
) -> LiveServer:
    port = free_port()
    log_path = log_dir / f"kvmem-server-{port}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [*server_command(), *args, "--port", str(port)],
            env=clean_env(env),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    server = LiveServer(proc, port, log_path)
    _STARTED.append(server)
    if wait:
        wait_healthy(server)
    return server


_STARTED: list[LiveServer] = []  # every server start_server made in this session


@pytest.fixture(scope="session", autouse=True)
def _no_server_outlives_the_session() -> Iterator[None]:
    """A test that fails before it stops its server leaves the process running (and using
    the cores) after the suite; kill whatever is still alive at the session's end."""
    yield
    for server in _STARTED:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait(timeout=30)


def wait_healthy(server: LiveServer, timeout: float = STARTUP_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise AssertionError(
                f"kvmem-server exited with {server.proc.returncode}:\n{server.log()[-3000:]}"
            )
        try:
            if httpx.get(server.base_url + "/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    server.stop()
    raise AssertionError(f"kvmem-server was not healthy within {timeout}s:\n{server.log()[-3000:]}")


def run_server(
    args: Sequence[str], env: Mapping[str, str] | None = None, timeout: float = 120.0
) -> subprocess.CompletedProcess[str]:
    """Run kvmem-server expecting it to exit on its own (validation failures, --help)."""
    return subprocess.run(
        [*server_command(), *args],
        env=clean_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="session")
def server_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("server-logs")


@pytest.fixture(scope="session")
def main_server(server_logs: Path) -> Iterator[LiveServer]:
    server = start_server(MAIN_ARGS, server_logs)
    yield server
    assert server.stop() == 0, server.log()[-3000:]


@pytest.fixture(scope="session")
def auth_server(server_logs: Path) -> Iterator[LiveServer]:
    key_file = server_logs / "keys.txt"
    key_file.write_bytes(f"# test keys\r\n\r\n{AUTH_KEY_FILE}\r\n".encode())
    server = start_server(
        [
            "-c",
            "2048",
            "--api-key",
            AUTH_KEYS_CLI,
            "--api-key-file",
            str(key_file),
            "-t",
            "2",
            "--metrics",
            "--cors-origins",
            "http://localhost:3000",
        ],
        server_logs,
        env={"LLAMA_API_KEY": AUTH_KEY_ENV},
    )
    yield server
    assert server.stop() == 0, server.log()[-3000:]
