"""Launching kvmem-server under an address-space limit, and raw-socket helpers."""

from __future__ import annotations

import resource
import socket
import subprocess
from collections.abc import Sequence
from pathlib import Path

import httpx
from hypothesis import HealthCheck, settings

from tests.server.conftest import LiveServer, clean_env, free_port, server_command, wait_healthy

ADDRESS_SPACE_LIMIT = 6 * 1024**3  # far below the 23 GB the min>max schema once reached
HI = [{"role": "user", "content": "Say hi."}]
NORMAL = {"messages": HI, "max_tokens": 4, "temperature": 0}  # a short greedy request


def live_settings(cases: int) -> settings:
    """Hypothesis settings for cases sent to a live server: `cases` derandomized examples
    (CI draws the same ones for the same test source), no deadline, no example database."""
    return settings(
        max_examples=cases,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )


def normal_answer(server: LiveServer) -> str:
    """The server's greedy answer to NORMAL (a hostile case must leave it unchanged)."""
    r = httpx.post(server.base_url + "/v1/chat/completions", json=NORMAL, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def fresh_answer(args: Sequence[str], log_dir: Path) -> str:
    """The greedy answer to NORMAL of a fresh server with `args` (started and stopped):
    a server that took hostile cases must still give it."""
    fresh = start_limited(args, log_dir)
    try:
        return normal_answer(fresh)
    finally:
        assert fresh.stop() == 0, fresh.log()[-3000:]


def _limit_address_space() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_LIMIT, ADDRESS_SPACE_LIMIT))


def start_limited(args: Sequence[str], log_dir: Path, wait: bool = True) -> LiveServer:
    port = free_port()
    log_path = log_dir / f"kvmem-server-limited-{port}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [*server_command(), *args, "--port", str(port)],
            env=clean_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=_limit_address_space,
        )
    server = LiveServer(proc, port, log_path)
    if wait:
        wait_healthy(server)
    return server


def raw_request(port: int, data: bytes, timeout: float = 30.0) -> bytes:
    """Send `data` on a fresh connection and read until the server closes it."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks)


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1]) if response.startswith(b"HTTP/1.1 ") else 0
