"""kvmem-launch against real processes: start, reuse, refusal, --restart, --stop, foreign listeners."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from kvmem.launch.listener import find_listener, pid_alive
from kvmem.launch.service import ServiceFiles, Started, stop
from tests.server.conftest import clean_env, free_port

pytestmark = pytest.mark.slow


def launch(state: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = clean_env({"KVMEM_LAUNCH_DIR": str(state), **env})
    for name in ("MODEL", "MMPROJ", "HOST", "PORT", "API_KEY_FILE"):
        if name not in env:
            environ.pop(name, None)
    return subprocess.run(
        [sys.executable, "-m", "kvmem.launch.main", *args],
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def pid_of(state: Path, port: int) -> int:
    return json.loads((state / f"server-{port}.pid").read_text())["pid"]


def wait_until(condition, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.1)


def model_id(port: int) -> str:
    return httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=30).json()["data"][0]["id"]


def test_start_reuse_refuse_restart_stop(tmp_path: Path) -> None:
    port = free_port()
    recipe = ("cpu-smollm2", "--port", str(port))
    extra = ("--", "-c", "2048", "-t", "2", "--alias", "first")
    started = launch(tmp_path, *recipe, *extra)
    assert started.returncode == 0, started.stderr
    assert f"serving at http://127.0.0.1:{port}/" in started.stderr
    first = pid_of(tmp_path, port)
    try:
        assert model_id(port) == "first"
        listener = find_listener(port)
        assert listener is not None and (listener.pid, listener.uid) == (first, os.getuid())

        again = launch(tmp_path, *recipe, *extra)
        assert again.returncode == 0, again.stderr
        assert (
            f"reusing the running server at http://127.0.0.1:{port}/ (pid {first})" in again.stderr
        )

        other = ("--", "-c", "2048", "-t", "2", "--alias", "second")
        mismatch = launch(tmp_path, *recipe, *other)
        assert mismatch.returncode == 1
        assert "does not match: it runs different arguments" in mismatch.stderr
        assert "use --restart" in mismatch.stderr

        # --restart checks files first: a missing model stops nothing
        missing = launch(tmp_path, *recipe, "--restart", *other, MODEL=str(tmp_path / "no.gguf"))
        assert (
            missing.returncode == 2
            and f"model: not found: {tmp_path / 'no.gguf'}" in missing.stderr
        )
        assert pid_alive(first) and model_id(port) == "first"

        restarted = launch(tmp_path, *recipe, "--restart", *other)
        assert restarted.returncode == 0, restarted.stderr
        assert f"pid {first} stopped with SIGTERM" in restarted.stderr
        second = pid_of(tmp_path, port)
        assert second != first and not pid_alive(first)
        assert model_id(port) == "second"
    finally:
        stopped = launch(tmp_path, *recipe, "--stop")
    assert stopped.returncode == 0, stopped.stderr
    assert "stopped with SIGTERM" in stopped.stderr
    assert find_listener(port) is None and not (tmp_path / f"server-{port}.pid").exists()
    assert "no server started by kvmem-launch" in launch(tmp_path, *recipe, "--stop").stderr


def test_a_matching_server_it_did_not_start_is_reused_but_never_stopped(tmp_path: Path) -> None:
    port = free_port()
    recipe = ("cpu-smollm2", "--port", str(port), "--", "-c", "2048", "-t", "2")
    plan = json.loads(launch(tmp_path, "--dry-run", *recipe).stdout)
    log = (tmp_path / "own.log").open("wb")
    proc = subprocess.Popen(plan["argv"], env=clean_env(), stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: _healthy(port), timeout=300)
        reused = launch(tmp_path, *recipe)
        assert reused.returncode == 0, reused.stderr
        assert f"reusing the running server at http://127.0.0.1:{port}/ (pid {proc.pid})" in (
            reused.stderr
        )
        for mode in ("--restart", "--stop"):
            refused = launch(tmp_path, mode, *recipe)
            assert refused.returncode == 1
            assert "held by a listener this launcher did not start" in refused.stderr
        assert proc.poll() is None and _healthy(port)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0


def test_a_foreign_listener_is_never_touched(tmp_path: Path) -> None:
    port = free_port()
    foreign = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: find_listener(port) is not None)
        recipe = ("cpu-smollm2", "--port", str(port))
        plain = launch(tmp_path, *recipe)
        assert plain.returncode == 1
        assert (
            f"port {port} is in use and not reusable: it runs different arguments" in plain.stderr
        )
        assert "http.server" in plain.stderr
        for mode in ("--restart", "--stop"):
            refused = launch(tmp_path, mode, *recipe)
            assert refused.returncode == 1, refused.stderr
            assert "did not start" in refused.stderr and "http.server" in refused.stderr
        assert foreign.poll() is None
        assert httpx.get(f"http://127.0.0.1:{port}/", timeout=10).status_code == 200
        assert not (tmp_path / f"server-{port}.pid").exists()
    finally:
        foreign.terminate()
        foreign.wait(10)


def test_stop_escalates_to_sigkill_after_the_grace_period(tmp_path: Path) -> None:
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"1\n"
    os.environ["KVMEM_LAUNCH_DIR"] = str(tmp_path)
    try:
        files = ServiceFiles(1)
        t0 = time.monotonic()
        how = stop(Started(proc.pid, ()), files, grace_s=1.0)
    finally:
        del os.environ["KVMEM_LAUNCH_DIR"]
    assert how == "killed with SIGKILL after 1 s" and 1.0 <= time.monotonic() - t0 < 10
    assert proc.wait(5) == -signal.SIGKILL


def _healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_the_rpc_recipe_starts_its_workers_and_a_server_over_them(tmp_path: Path) -> None:
    """kvmem-launch rpc-smollm2 for real (issue 31): two kvmem-rpc-worker processes, the
    server over them answering with its layers on the workers, and --stop ending all three."""
    packaged = Path(__file__).parents[2] / "src/kvmem/launch/recipes/rpc-smollm2.json"
    data = json.loads(packaged.read_text())
    base = _two_free_ports()
    port = free_port()
    assert port not in (base, base + 1)
    data["rpc"]["base_port"] = base
    recipe = tmp_path / "rpc.json"
    recipe.write_text(json.dumps(data))
    extra = ("--", "-c", "2048", "-t", "1")
    started = launch(tmp_path, str(recipe), "--port", str(port), *extra)
    assert started.returncode == 0, started.stderr
    workers = [pid_of_worker(tmp_path, base + i) for i in range(2)]
    try:
        health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=30).json()
        endpoints = [f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}"]
        assert health == {"status": "ok", "rpc": {"workers": endpoints, "lost": []}}
        props = httpx.get(f"http://127.0.0.1:{port}/props", timeout=30).json()
        assert props["rpc"]["workers"] == endpoints
        assert {layer["endpoint"] for layer in props["rpc"]["layers"]} == set(endpoints)
        reply = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
            timeout=120,
        )
        assert reply.status_code == 200
        assert reply.json()["usage"]["completion_tokens"] >= 1
    finally:
        stopped = launch(tmp_path, str(recipe), "--port", str(port), "--stop")
    assert stopped.returncode == 0, stopped.stderr
    wait_until(lambda: not any(pid_alive(pid) for pid in workers))
    assert find_listener(port) is None


def _two_free_ports() -> int:
    """A port P with P + 1 free too (the recipe's workers take base_port and the next)."""
    while True:
        base = free_port()
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", base + 1))
            except OSError:
                continue
        return base


def pid_of_worker(state: Path, port: int) -> int:
    return json.loads((state / f"worker-{port}.pid").read_text())["pid"]
