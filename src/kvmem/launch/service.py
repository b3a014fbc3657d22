"""The server a launcher started: its pidfile, lock and log, and starting/stopping it.

State lives in `$KVMEM_LAUNCH_DIR` (default ~/.cache/kvmem/launch), per port:
`server-<port>.pid` (JSON: pid and argv), `server-<port>.lock` (flock while a launcher
works on the port) and `server-<port>.log`. A pidfile is trusted only while its process
is alive and still runs the recorded argv (a reused pid is not ours).
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from kvmem.errors import ConfigError
from kvmem.launch.listener import Listener, find_listener, pid_alive, process_cmdline

STOP_GRACE_S = 10.0


class LaunchRefused(Exception):
    """The launcher will not act (a foreign listener, a mismatching server, a busy lock)."""


def state_dir() -> Path:
    base = os.environ.get("KVMEM_LAUNCH_DIR") or str(Path.home() / ".cache" / "kvmem" / "launch")
    path = Path(base)
    path.mkdir(parents=True, exist_ok=True)
    return path


@dataclass(frozen=True, slots=True)
class ServiceFiles:
    port: int
    kind: str = "server"  # or "worker": a recipe's RPC worker (launch/workers.py)

    @property
    def pidfile(self) -> Path:
        return state_dir() / f"{self.kind}-{self.port}.pid"

    @property
    def lockfile(self) -> Path:
        return state_dir() / f"{self.kind}-{self.port}.lock"

    @property
    def log(self) -> Path:
        return state_dir() / f"{self.kind}-{self.port}.log"


@contextmanager
def port_lock(files: ServiceFiles) -> Iterator[None]:
    with files.lockfile.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LaunchRefused(
                f"another kvmem-launch is working on port {files.port} ({files.lockfile})"
            ) from None
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@dataclass(frozen=True, slots=True)
class Started:
    pid: int
    argv: tuple[str, ...]


def read_ours(files: ServiceFiles) -> Started | None:
    """The server this launcher started on the port, if it still runs; clears a stale pidfile."""
    try:
        data = json.loads(files.pidfile.read_text())
        started = Started(int(data["pid"]), tuple(data["argv"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if pid_alive(started.pid) and process_cmdline(started.pid) == started.argv:
        return started
    files.pidfile.unlink(missing_ok=True)
    return None


def healthy(host: str, port: int, timeout: float = 3.0) -> bool:
    host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/health", timeout=timeout) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def matching_listener(listener: Listener, argv: list[str], host: str) -> str | None:
    """None when `listener` is a server to reuse; else why not."""
    if listener.uid != os.getuid():
        return f"it belongs to another user ({listener.describe()})"
    if listener.pid is None or listener.cmdline is None:
        return f"its process is not visible ({listener.describe()})"
    if listener.cmdline != tuple(argv):
        return f"it runs different arguments ({listener.describe()})"
    if not healthy(host, listener.port):
        return f"it does not answer /health with 200 ({listener.describe()})"
    return None


def start(argv: list[str], files: ServiceFiles, host: str, wait_s: float) -> Started:
    with files.log.open("ab") as log:
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    started = Started(proc.pid, tuple(argv))
    files.pidfile.write_text(json.dumps({"pid": proc.pid, "argv": argv, "started": time.time()}))
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        code = proc.poll()
        if code is not None:
            files.pidfile.unlink(missing_ok=True)
            tail = files.log.read_text(errors="replace")[-2000:]
            raise ConfigError(
                "kvmem-server", f"exited with {code} while starting; log {files.log}:\n{tail}"
            )
        if healthy(host, int(argv[argv.index("--port") + 1]), timeout=1.0):
            return started
        time.sleep(0.25)
    raise LaunchRefused(
        f"kvmem-server (pid {proc.pid}) was not healthy within {wait_s:.0f} s; log {files.log}"
    )


def stop(started: Started, files: ServiceFiles, grace_s: float = STOP_GRACE_S) -> str:
    """SIGTERM, then SIGKILL after `grace_s`; returns how it ended."""
    os.kill(started.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    how = "stopped with SIGTERM"
    while pid_alive(started.pid):
        if time.monotonic() >= deadline:
            os.kill(started.pid, signal.SIGKILL)
            how = f"killed with SIGKILL after {grace_s:.0f} s"
            while pid_alive(started.pid):
                time.sleep(0.05)
            break
        time.sleep(0.1)
    files.pidfile.unlink(missing_ok=True)
    return how


def listener_on(port: int) -> Listener | None:
    return find_listener(port)
