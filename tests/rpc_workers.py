"""Local kvmem-rpc-worker processes on loopback, for the engine and server RPC tests.

CI builds llama-cpp-python with the RPC backend (scripts/setup.sh), so a build without it
fails these tests; only KVMEM_BUILD_WITHOUT_RPC=1 (the build was made without it on
purpose) turns them into skips.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvmem.settings.rpc_endpoints import RpcEndpoint
from tests.server.conftest import free_port

WITHOUT_RPC_ENV = "KVMEM_BUILD_WITHOUT_RPC"
START_TIMEOUT_S = 60.0


def require_rpc() -> None:
    from kvmem.engine.llama.rpc import NO_RPC_MESSAGE, rpc_library

    if rpc_library().available:
        return
    if os.environ.get(WITHOUT_RPC_ENV) == "1":
        pytest.skip(f"{WITHOUT_RPC_ENV}=1: this llama-cpp-python build has no RPC backend")
    pytest.fail(f"{NO_RPC_MESSAGE} (or set {WITHOUT_RPC_ENV}=1 to skip the RPC tests)")


@dataclass
class Worker:
    proc: subprocess.Popen[bytes]
    endpoint: RpcEndpoint
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)


def _accepting(endpoint: RpcEndpoint) -> bool:
    try:
        with socket.create_connection((endpoint.host, endpoint.port), 1.0):
            return True
    except OSError:
        return False


def start_workers(n: int, log_dir: Path, threads: int = 1) -> list[Worker]:
    workers = []
    for _ in range(n):
        endpoint = RpcEndpoint("127.0.0.1", free_port())
        log_path = log_dir / f"rpc-worker-{endpoint.port}.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "kvmem.console.rpc_worker", "--port", str(endpoint.port)]
                + ["-t", str(threads)],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        workers.append(Worker(proc, endpoint, log_path))
    deadline = time.monotonic() + START_TIMEOUT_S
    for worker in workers:
        while not _accepting(worker.endpoint):
            if worker.proc.poll() is not None or time.monotonic() > deadline:
                stop_workers(workers)
                raise AssertionError(f"kvmem-rpc-worker did not start:\n{worker.log()}")
            time.sleep(0.1)
    return workers


def stop_workers(workers: list[Worker]) -> None:
    for worker in workers:
        worker.kill()


def endpoints(workers: list[Worker]) -> tuple[RpcEndpoint, ...]:
    return tuple(w.endpoint for w in workers)
