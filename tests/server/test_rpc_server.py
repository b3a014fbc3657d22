"""kvmem-server --rpc over two kvmem-rpc-worker processes on loopback: where the layers
live (/props, KVMEM_STARTUP, /health), and a worker killed mid-turn."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.rpc_workers import Worker, require_rpc, start_workers, stop_workers

from .conftest import LiveServer, start_server

LOST_WITHIN_S = 120.0  # generous: the error must come, not hang


@pytest.fixture(scope="module")
def rpc_setup(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[LiveServer, list[Worker]]]:
    require_rpc()
    logs = tmp_path_factory.mktemp("rpc-server")
    workers = start_workers(2, logs, threads=2)
    rpc = ",".join(str(w.endpoint) for w in workers)
    try:
        server = start_server(
            ["-c", "2048", "-t", "2", "--rpc", rpc, "-ts", "1,1", "--kvmem-trace"], logs
        )
    except BaseException:
        stop_workers(workers)
        raise
    yield server, workers
    try:
        assert server.stop() == 0, server.log()[-3000:]  # SIGTERM, even after a lost worker
    finally:
        stop_workers(workers)


def _placement(workers: list[Worker]) -> dict[str, object]:
    first, second = (str(w.endpoint) for w in workers)
    return {
        "workers": [first, second],
        "layers": [
            {"device": "RPC0", "endpoint": first, "first": 0, "last": 15},
            {"device": "RPC1", "endpoint": second, "first": 16, "last": 29},
        ],
        "output": {"device": "RPC1", "endpoint": second},
    }


def test_props_startup_and_health_say_where_the_layers_live(rpc_setup) -> None:
    server, workers = rpc_setup
    with server.http() as http:
        assert http.get("/props").json()["rpc"] == _placement(workers)
        health = http.get("/health")
        assert health.status_code == 200
        assert health.json() == {
            "status": "ok",
            "rpc": {"workers": [str(w.endpoint) for w in workers], "lost": []},
        }
        answer = http.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
        )
        assert answer.status_code == 200
        assert answer.json()["usage"]["completion_tokens"] >= 1
        transfer = http.get("/props").json()["kvmem"]["transfer"]
        assert transfer["prefill_decode"]["net_bytes"] > 0
    ready = [ln for ln in server.log().splitlines() if ln.startswith("KVMEM_STARTUP ready=")]
    assert json.loads(ready[0].removeprefix("KVMEM_STARTUP ready="))["rpc"] == _placement(workers)


def test_a_worker_killed_mid_turn(rpc_setup) -> None:
    server, workers = rpc_setup
    body = {
        "messages": [{"role": "user", "content": "Count from 1 to 1000, one number a line."}],
        "max_tokens": 1500,
        "temperature": 0,
        "stream": True,
    }
    events: list[dict] = []
    t0 = time.monotonic()
    with httpx.Client(base_url=server.base_url, timeout=LOST_WITHIN_S) as http:
        with http.stream("POST", "/v1/chat/completions", json=body) as stream:
            assert stream.status_code == 200
            for line in stream.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                events.append(json.loads(line.removeprefix("data: ")))
                if len(events) == 3:  # generating: kill the second worker
                    workers[1].kill()
        assert time.monotonic() - t0 < LOST_WITHIN_S
        error = events[-1]["error"]
        lost = str(workers[1].endpoint)
        assert error["code"] == "rpc_worker_lost"
        assert error["type"] == "unavailable_error"
        assert lost in error["message"]
        # the turn did not finish: no chunk before the error has a finish reason
        assert all(
            c["choices"][0]["finish_reason"] is None for c in events[:-1] if c.get("choices")
        )
        health = http.get("/health")
        assert health.status_code == 503
        assert health.json()["status"] == "rpc_worker_lost"
        assert health.json()["rpc"] == {
            "workers": [str(w.endpoint) for w in workers],
            "lost": [lost],
        }
        again = http.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}]}
        )
        assert again.status_code == 503
        assert again.json()["error"]["code"] == "rpc_worker_lost"
        assert http.get("/v1/models").status_code == 503
    assert server.proc.poll() is None  # the server stayed up
