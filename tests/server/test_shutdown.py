"""SIGTERM, SIGINT and SIGHUP during a long prefill or a long decode: exit 0 within 5 s
(issue 28), every client gets an ending: the stream a terminal event and [DONE], the
queued request a 503 `shutting_down`.

The prefill is made long with a small model and a small batch (`-b 8 -ub 8`, one thread), not with a
huge prompt: it then takes many seconds, and the signal arrives while llama.cpp is busy. The
decode is made long with `ignore_eos` and a large `max_tokens`; the signal comes once tokens flow.
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

EXIT_WITHIN_S = 5.0
# (phase, signal): 6 rounds during prefill, 4 during decode
ROUNDS = [
    *(("prefill", sig) for sig in ("SIGTERM", "SIGINT", "SIGHUP") * 2),
    *(("decode", sig) for sig in ("SIGTERM", "SIGINT") * 2),
]
ARGS = ("-c", "8192", "-b", "8", "-ub", "8", "-t", "1", "--no-ui")
WORDS = "the quick brown fox jumps over the lazy dog near the river bank today "
LONG = [{"role": "user", "content": WORDS * 300}]  # about 4,000 tokens
BODIES = {
    "prefill": {"messages": LONG, "stream": True, "max_tokens": 8},
    "decode": {
        "messages": [{"role": "user", "content": "Tell a long story."}],
        "stream": True,
        "max_tokens": 4000,
        "ignore_eos": True,
    },
}


def _stream_until_end(
    base_url: str, phase: str, started: threading.Event, out: dict[str, object]
) -> None:
    try:
        with (
            httpx.Client(base_url=base_url, timeout=120) as http,
            http.stream("POST", "/v1/chat/completions", json=BODIES[phase]) as response,
        ):
            out["status"] = response.status_code
            lines = []
            for line in response.iter_lines():
                if line:
                    lines.append(line)
                # prefill: the headers come once the job left the queue; decode: tokens flow
                if phase == "prefill" or len(lines) >= 4:
                    started.set()
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


@pytest.mark.parametrize(("phase", "name"), ROUNDS, ids=[f"{p}-{s}" for p, s in ROUNDS])
def test_signal_during_a_long_generation_exits_0_within_5_s_and_ends_every_client(
    phase: str, name: str, tmp_path: Path
) -> None:
    sig = getattr(signal, name)
    server = start_limited(ARGS, tmp_path)
    try:
        started = threading.Event()
        streamed: dict[str, object] = {}
        queued: dict[str, object] = {}
        t1 = threading.Thread(
            target=_stream_until_end, args=(server.base_url, phase, started, streamed)
        )
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
    assert last["error"]["code"] == "shutting_down", last  # a terminal error event
    stopped = {
        "prefill": "the prompt's processing was cancelled",
        "decode": "the generation was stopped by the shutdown",
    }
    assert stopped[phase] in log
    assert queued.get("status") == 503, queued
    assert queued["body"]["error"]["code"] == "shutting_down"  # type: ignore[index]
