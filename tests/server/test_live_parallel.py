"""`--parallel 2` with a real kvmem-server (SmolLM2-135M): two lanes, one model.

One server (`--parallel 2 --queue-size 1`) for the whole module, ended by the last test's
SIGTERM: two concurrent streams both complete and their greedy texts equal the same
prompts run one after the other; /props, /slots and /metrics report two lanes; a third
client queues and completes, a fourth is refused with 503; a SIGTERM while both lanes
stream ends both streams and the process exits 0.
"""

from __future__ import annotations

import json
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import LiveServer, start_server

pytestmark = pytest.mark.slow

BUDGET, RESERVE = 1024, 512
ARGS = ("-c", "4096", "--kvmem-budget", str(BUDGET), "--kvmem-gen-reserve", str(RESERVE))
ARGS += ("--parallel", "2", "--queue-size", "1", "-t", "1", "--metrics", "--seed", "1")
PROMPTS = ("Write a long story about a lighthouse keeper.", "Describe a busy night market.")
LONG = "Tell a very long story about a dragon, a knight and a wizard, with many chapters."


def messages(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


@pytest.fixture(scope="module")
def server(server_logs: Path) -> Iterator[LiveServer]:
    live = start_server(ARGS, server_logs)
    yield live
    live.stop()


def chat(server: LiveServer, text: str, max_tokens: int) -> dict:
    r = httpx.post(
        server.base_url + "/v1/chat/completions",
        json={"messages": messages(text), "max_tokens": max_tokens, "temperature": 0},
        timeout=300,
    )
    assert r.status_code == 200, r.text
    return r.json()


class Stream(threading.Thread):
    """A streaming client; `ready` is set after its `after`-th content chunk."""

    def __init__(self, server: LiveServer, text: str, max_tokens: int, after: int = 2) -> None:
        super().__init__()
        self.url, self.text, self.max_tokens, self.after = server.base_url, text, max_tokens, after
        self.ready, self.chunks, self.lines = threading.Event(), [], []
        self.status: int | None = None
        self.error: str | None = None
        self.first_at = self.end_at = 0.0

    def run(self) -> None:
        body = {
            "messages": messages(self.text),
            "max_tokens": self.max_tokens,
            "temperature": 0,
            "stream": True,
        }
        try:
            with (
                httpx.Client(base_url=self.url, timeout=300) as http,
                http.stream("POST", "/v1/chat/completions", json=body) as response,
            ):
                self.status = response.status_code
                for line in response.iter_lines():
                    if not line:
                        continue
                    self.lines.append(line)
                    if line.startswith("data: {"):
                        chunk = json.loads(line[6:])
                        delta = (chunk.get("choices") or [{}])[0].get("delta", {})
                        if delta.get("content"):
                            self.chunks.append(delta["content"])
                            if len(self.chunks) == 1:
                                self.first_at = time.monotonic()
                            if len(self.chunks) == self.after:
                                self.ready.set()
        except httpx.HTTPError as exc:
            self.error = repr(exc)
        finally:
            self.end_at = time.monotonic()
            self.ready.set()

    @property
    def content(self) -> str:
        return "".join(self.chunks)

    def last_event(self) -> dict:
        assert self.lines[-1] == "data: [DONE]", self.lines[-3:]
        return json.loads(self.lines[-2][len("data: ") :])


def metric(server: LiveServer, name: str) -> float:
    text = httpx.get(server.base_url + "/metrics", timeout=30).text
    return float(re.search(rf"^{name} (\S+)$", text, re.M).group(1))  # type: ignore[union-attr]


def busy_slots(server: LiveServer) -> list[bool]:
    return [s["is_processing"] for s in httpx.get(server.base_url + "/slots").json()]


def test_props_and_slots_report_two_lanes(server: LiveServer) -> None:
    props = httpx.get(server.base_url + "/props").json()
    assert props["total_slots"] == 2
    assert (props["kvmem"]["lanes"], props["kvmem"]["gpu_cells"]) == (2, 2 * (BUDGET + RESERVE))
    slots = httpx.get(server.base_url + "/slots").json()
    assert [(s["id"], s["is_processing"]) for s in slots] == [(0, False), (1, False)]
    assert metric(server, "kvmem_gpu_cells_max") == 2 * (BUDGET + RESERVE)


def test_two_concurrent_streams_equal_sequential_runs(server: LiveServer) -> None:
    streams = [Stream(server, p, 48) for p in PROMPTS]
    for s in streams:
        s.start()
    for s in streams:
        assert s.ready.wait(120)
    during = busy_slots(server), metric(server, "kvmem_requests_processing")
    for s in streams:
        s.join(120)
    assert [s.status for s in streams] == [200, 200] and [s.error for s in streams] == [None] * 2
    assert all(len(s.chunks) > 8 for s in streams)
    # both were generating at once: each started before the other ended
    assert streams[0].first_at < streams[1].end_at and streams[1].first_at < streams[0].end_at
    assert during == ([True, True], 2.0), during
    finishes = [s.last_event()["choices"][0]["finish_reason"] for s in streams]
    sequential = [chat(server, p, 48) for p in PROMPTS]
    assert [s.content for s in streams] == [
        b["choices"][0]["message"]["content"] for b in sequential
    ]
    assert finishes == [b["choices"][0]["finish_reason"] for b in sequential]
    assert busy_slots(server) == [False, False]
    assert metric(server, "kvmem_requests_processing") == 0


def test_a_third_client_queues_a_fourth_gets_503(server: LiveServer) -> None:
    streams = [Stream(server, LONG + f" Version {i}.", 96) for i in range(2)]
    for s in streams:
        s.start()
    for s in streams:
        assert s.ready.wait(120)
    out: dict = {}

    def third() -> None:
        out["body"] = chat(server, "Say hi.", 4)

    waiter = threading.Thread(target=third)
    waiter.start()
    deadline = time.monotonic() + 30
    while metric(server, "kvmem_requests_deferred") != 1:
        assert time.monotonic() < deadline, "the third request never queued"
        time.sleep(0.05)
    refused = httpx.post(
        server.base_url + "/v1/chat/completions",
        json={"messages": messages("Say hi."), "max_tokens": 4},
        timeout=30,
    )
    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "queue_full"
    waiter.join(300)
    for s in streams:
        s.join(300)
    assert out["body"]["choices"][0]["message"]["content"]
    assert [s.status for s in streams] == [200, 200]


def test_sigterm_while_both_lanes_stream_ends_both_and_exits_0(server: LiveServer) -> None:
    streams = [Stream(server, LONG + f" Part {i}.", 400) for i in range(2)]
    for s in streams:
        s.start()
    for s in streams:
        assert s.ready.wait(120)
    assert busy_slots(server) == [True, True]
    server.proc.send_signal(signal.SIGTERM)
    code = server.proc.wait(60)
    for s in streams:
        s.join(60)
    log = server.log()
    assert code == 0, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    for s in streams:
        assert s.status == 200 and s.error is None, s.error
        last = s.last_event()
        terminal = last.get("error") or last["choices"][0]["finish_reason"]
        assert terminal, last
        assert len(s.chunks) < 400
