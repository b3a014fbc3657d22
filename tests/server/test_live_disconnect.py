"""Clients that go away free what they hold, on every API (issue 27, issue 28 item 5).

A non-stream request whose client goes away is cancelled while tokens flow (llama.cpp's
test_cancel_request: a 0.1 s client timeout and `n_predict: -1`). A queued request whose
client leaves is withdrawn from the queue at once, on chat, /completion, /v1/completions,
Responses, Anthropic and the slot actions: one slot is held busy by a long generation, a
second request waits, its client disconnects, and /metrics shows the queue empty while
the long generation still runs; the withdrawn request never runs.
"""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import LiveServer, start_server

pytestmark = pytest.mark.slow

WITHDRAWN_WITHIN_S = 5.0  # the disconnect poll is 0.25 s; slack for a loaded CI machine
HI = [{"role": "user", "content": "Say hi."}]


@pytest.fixture(scope="module")
def slot_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("slots")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, slot_dir: Path) -> Iterator[LiveServer]:
    args = ["-c", "4096", "-t", "2", "--metrics", "--slot-save-path", str(slot_dir)]
    live = start_server(args, tmp_path_factory.mktemp("disconnect"))
    yield live
    assert live.stop() == 0


def _busy(server: LiveServer) -> bool:
    return httpx.get(server.base_url + "/slots", timeout=30).json()[0]["is_processing"]


def _wait_idle(server: LiveServer, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _busy(server):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/completion", {"prompt": "I believe the meaning of life is", "n_predict": -1}),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "Tell a very long story."}],
             "max_tokens": 6000, "temperature": 1.0},
        ),
    ],
)  # fmt: skip
def test_a_client_that_times_out_cancels_its_generation(
    server: LiveServer, path: str, body: dict
) -> None:
    assert _wait_idle(server, 120)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.base_url + path, json={**body, "ignore_eos": True}, timeout=1.5)
    # the generation stops within a poll interval, not thousands of tokens later (the slack
    # is for a loaded CI machine; uncancelled, 4000 tokens take far longer)
    assert _wait_idle(server, 10.0)


def _metrics(server: LiveServer) -> dict[str, float]:
    text = httpx.get(server.base_url + "/metrics", timeout=30).text
    return {m[1]: float(m[2]) for m in re.finditer(r"^(kvmem_\w+) (\S+)$", text, re.M)}


def _open(server: LiveServer, path: str, body: dict) -> socket.socket:
    """A POST sent on a raw connection, left open (closing it is the client leaving)."""
    data = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    )
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    sock.sendall(head.encode() + data)
    return sock


def _wait_for(server: LiveServer, name: str, value: float, seconds: float) -> dict[str, float]:
    deadline = time.monotonic() + seconds
    while True:
        metrics = _metrics(server)
        if metrics[name] == value or time.monotonic() > deadline:
            return metrics
        time.sleep(0.05)


QUEUED = [
    ("/v1/chat/completions", {"messages": HI, "max_tokens": 2}),
    ("/completion", {"prompt": "Hello", "n_predict": 2}),
    ("/v1/completions", {"prompt": "Hello", "max_tokens": 2}),
    ("/v1/responses", {"input": "Say hi.", "max_output_tokens": 2}),
    ("/v1/messages", {"model": "m", "max_tokens": 2, "messages": HI}),
    ("/slots/0?action=save", {"filename": "withdrawn.bin"}),
]


@pytest.mark.parametrize(("path", "body"), QUEUED, ids=[p for p, _ in QUEUED])
def test_a_queued_request_is_withdrawn_when_its_client_leaves(
    server: LiveServer, slot_dir: Path, path: str, body: dict
) -> None:
    assert _wait_idle(server, 120)
    blocker = _open(
        server, "/completion", {"prompt": "Once upon", "n_predict": -1, "ignore_eos": True,
                                "stream": True},
    )  # fmt: skip
    try:
        assert blocker.recv(12) == b"HTTP/1.1 200"  # the long generation holds the slot
        before = _metrics(server)
        assert (before["kvmem_requests_processing"], before["kvmem_requests_deferred"]) == (1, 0)
        queued = _open(server, path, body)
        waiting = _wait_for(server, "kvmem_requests_deferred", 1, 30)
        assert waiting["kvmem_requests_deferred"] == 1
        queued.close()  # the queued client leaves
        after = _wait_for(server, "kvmem_requests_deferred", 0, WITHDRAWN_WITHIN_S)
        assert (after["kvmem_requests_deferred"], after["kvmem_requests_processing"]) == (0, 1)
        assert _busy(server)  # the long generation still runs
    finally:
        blocker.close()
    assert _wait_idle(server, 10.0)
    done = _metrics(server)
    # only the blocker ran: the withdrawn request was neither run nor counted as failed
    assert done["kvmem_requests_total"] == before["kvmem_requests_total"] + 1
    assert done["kvmem_requests_failed_total"] == before["kvmem_requests_failed_total"]
    assert not (slot_dir / "withdrawn.bin").exists()
