"""A recipe's local RPC workers: plan them, start them before the server, stop them after.

A recipe with an `"rpc": {"workers": N, "base_port": P, "threads": T}` section starts N
`kvmem-rpc-worker` processes on 127.0.0.1:P, P+1, ... and passes them to kvmem-server as
`--rpc 127.0.0.1:P,...` (the layout of N machines, on one). Each worker has its own
pidfile and log beside the server's (`worker-<port>.pid`, `worker-<port>.log`); a worker is
reused only while the launcher's pidfile names the listener's process with the same argv.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvmem.errors import ConfigError
from kvmem.launch.listener import find_listener
from kvmem.launch.service import LaunchRefused, ServiceFiles, Started, read_ours, stop
from kvmem.settings.rpc_endpoints import LOOPBACK, RpcEndpoint

WORKER_MODULE = "kvmem.console.rpc_worker"
MAX_WORKERS = 16  # GGML_RPC_MAX_SERVERS


@dataclass(frozen=True, slots=True)
class RpcRecipe:
    workers: int
    base_port: int
    threads: int

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> RpcRecipe | None:
        if not data:
            return None
        recipe = cls(int(data["workers"]), int(data["base_port"]), int(data.get("threads", 1)))
        if not 0 < recipe.workers <= MAX_WORKERS:
            raise ValueError(f"rpc.workers must be 1-{MAX_WORKERS}, got {recipe.workers}")
        if not (recipe.base_port > 0 and recipe.base_port + recipe.workers <= 65536):
            raise ValueError(f"rpc.base_port {recipe.base_port} is out of range")
        return recipe


@dataclass(frozen=True, slots=True)
class WorkerPlan:
    endpoint: RpcEndpoint
    argv: tuple[str, ...]

    @property
    def files(self) -> ServiceFiles:
        return ServiceFiles(self.endpoint.port, kind="worker")

    def as_json(self) -> dict[str, object]:
        files = self.files
        return {
            "endpoint": str(self.endpoint),
            "argv": list(self.argv),
            "pidfile": str(files.pidfile),
            "log": str(files.log),
        }


def plan_workers(rpc: RpcRecipe, server_port: int) -> list[WorkerPlan]:
    plans = []
    for i in range(rpc.workers):
        port = rpc.base_port + i
        if port == server_port:
            raise ConfigError("PORT", f"the server's port {port} is also RPC worker {i}'s port")
        argv = (sys.executable, "-m", WORKER_MODULE, "--host", LOOPBACK, "--port", str(port))
        plans.append(WorkerPlan(RpcEndpoint(LOOPBACK, port), (*argv, "-t", str(rpc.threads))))
    return plans


def rpc_flag(plans: list[WorkerPlan]) -> list[str]:
    return ["--rpc", ",".join(str(p.endpoint) for p in plans)] if plans else []


def accepting(endpoint: RpcEndpoint, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((endpoint.host, endpoint.port), timeout):
            return True
    except OSError:
        return False


def _start(plan: WorkerPlan, wait_s: float) -> Started:
    files = plan.files
    with files.log.open("ab") as log:
        proc = subprocess.Popen(
            plan.argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    files.pidfile.write_text(
        json.dumps({"pid": proc.pid, "argv": list(plan.argv), "started": time.time()})
    )
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        code = proc.poll()
        if code is not None:
            files.pidfile.unlink(missing_ok=True)
            tail = files.log.read_text(errors="replace")[-2000:]
            raise ConfigError("kvmem-rpc-worker", f"exited with {code}; log {files.log}:\n{tail}")
        if accepting(plan.endpoint):
            return Started(proc.pid, plan.argv)
        time.sleep(0.1)
    raise LaunchRefused(f"the RPC worker {plan.endpoint} did not listen within {wait_s:.0f} s")


def ensure_workers(plans: list[WorkerPlan], restart: bool, wait_s: float) -> list[str]:
    """Start each worker (or reuse the launcher's own); returns what was done, per worker."""
    done = []
    for plan in plans:
        ours = read_ours(plan.files)
        listener = find_listener(plan.endpoint.port)
        if listener is not None and (ours is None or listener.pid != ours.pid):
            raise LaunchRefused(
                f"RPC worker port {plan.endpoint.port} is held by a listener this launcher did "
                f"not start ({listener.describe()})"
            )
        if ours is not None and ours.argv == plan.argv and not restart:
            done.append(f"reusing the RPC worker {plan.endpoint} (pid {ours.pid})")
            continue
        if ours is not None:
            stop(ours, plan.files)
        started = _start(plan, wait_s)
        done.append(f"RPC worker {plan.endpoint} started (pid {started.pid})")
    return done


def stop_workers(plans: list[WorkerPlan]) -> list[str]:
    done = []
    for plan in plans:
        ours = read_ours(plan.files)
        if ours is not None:
            done.append(f"RPC worker {plan.endpoint}: pid {ours.pid} {stop(ours, plan.files)}")
    return done
