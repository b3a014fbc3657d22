"""SIGTERM and SIGHUP during a long prefill: exit 0 quickly, every client gets an ending.

The prefill is made long with a small model and a small batch (`-b 8 -ub 8`, one thread), not with a
huge prompt: it then takes many seconds, and the signal arrives while llama.cpp is busy.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.server.hostile_helpers import start_limited

pytestmark = pytest.mark.slow

ROUNDS = 10
EXIT_WITHIN_S = 10.0
ARGS = ("-c", "8192", "-b", "8", "-ub", "8", "-t", "1", "--no-ui")
WORDS = "the quick brown fox jumps over the lazy dog near the river bank today "
LONG = [{"role": "user", "content": WORDS * 300}]  # about 4,000 tokens


def _stream_until_end(base_url: str, started: threading.Event, out: dict[str, object]) -> None:
    body = {"messages": LONG, "stream": True, "max_tokens": 8}
    try:
        with (
            httpx.Client(base_url=base_url, timeout=120) as http,
            http.stream("POST", "/v1/chat/completions", json=body) as response,
        ):
            out["status"] = response.status_code
            started.set()  # the headers come once the job left the queue: prefill runs
            lines = [line for line in response.iter_lines() if line]
        out["lines"] = lines
    except httpx.HTTPError as exc:
        out["error"] = repr(exc)
    finally:
        started.set()


def _queued(base_url: str, out: dict[str, object]) -> None:
    try:
        r = httpx.post(
            base_url + "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
            timeout=120,
        )
        out["status"], out["body"] = r.status_code, r.json()
    except httpx.HTTPError as exc:
        out["error"] = repr(exc)


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_signal_during_long_prefill_exits_0_and_ends_every_client(
    round_: int, tmp_path: Path
) -> None:
    sig = signal.SIGTERM if round_ % 2 == 0 else signal.SIGHUP
    server = start_limited(ARGS, tmp_path)
    try:
        started = threading.Event()
        streamed: dict[str, object] = {}
        queued: dict[str, object] = {}
        t1 = threading.Thread(target=_stream_until_end, args=(server.base_url, started, streamed))
        t1.start()
        assert started.wait(60), "the stream never started"
        assert streamed.get("status") == 200, streamed
        t2 = threading.Thread(target=_queued, args=(server.base_url, queued))
        t2.start()
        time.sleep(0.5)  # the second request waits in the queue; the prefill runs
        sent = time.monotonic()
        server.proc.send_signal(sig)
        code = server.proc.wait(EXIT_WITHIN_S + 20)
        took = time.monotonic() - sent
        t1.join(30)
        t2.join(30)
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()
    log = server.log()
    assert code == 0, log[-3000:]
    assert took < EXIT_WITHIN_S, f"exit took {took:.1f} s"
    assert "Traceback" not in log, log[-3000:]
    lines = streamed.get("lines")
    assert isinstance(lines, list), streamed
    assert lines[-1] == "data: [DONE]"
    last = json.loads(lines[-2][len("data: ") :])
    terminal = last.get("error") or last["choices"][0]["finish_reason"]
    assert terminal, last
    if "error" in last:
        assert last["error"]["code"] == "shutting_down"
    assert "the prompt's processing was cancelled" in log
    assert queued.get("status") == 503, queued
    assert queued["body"]["error"]["code"] == "shutting_down"  # type: ignore[index]
