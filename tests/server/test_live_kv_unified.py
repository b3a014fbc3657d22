"""`--parallel 2 --kv-unified -c 256` with a real kvmem-server (SmolLM2-135M).

One server for the module. A lane alone may use the whole `-c` (200 tokens generated,
past the 128 a lane gets without the flag); while one lane's request holds part of the
shared 256 tokens, a request on the other lane that would take the two past 256 ends
with llama-server's `500 Context size has been exceeded.` and the running one completes;
once it has, the same request is served.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import LiveServer, start_server

ARGS = ("-c", "256", "--parallel", "2", "--kv-unified", "-t", "1", "--seed", "1")


@pytest.fixture(scope="module")
def server(server_logs: Path) -> Iterator[LiveServer]:
    live = start_server(ARGS, server_logs)
    yield live
    live.stop()


def complete(server: LiveServer, prompt: str | list[int], n_predict: int) -> httpx.Response:
    body = {"prompt": prompt, "n_predict": n_predict, "ignore_eos": True, "temperature": 0}
    return httpx.post(server.base_url + "/completion", json=body, timeout=300)


class Stream(threading.Thread):
    """A streaming /completion; `ready` is set after its `after`-th token."""

    def __init__(self, server: LiveServer, n_predict: int, after: int) -> None:
        super().__init__()
        self.url, self.n_predict, self.after = server.base_url, n_predict, after
        self.ready, self.done = threading.Event(), threading.Event()
        self.chunks: list[dict] = []

    def run(self) -> None:
        body = {"prompt": "A", "n_predict": self.n_predict, "ignore_eos": True, "stream": True}
        try:
            with httpx.stream("POST", self.url + "/completion", json=body, timeout=300) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        self.chunks.append(json.loads(line[6:]))
                        if len(self.chunks) == self.after:
                            self.ready.set()
        finally:
            self.done.set()
            self.ready.set()


def test_one_lane_may_use_the_whole_context(server: LiveServer) -> None:
    props = httpx.get(server.base_url + "/props").json()
    assert (props["total_slots"], props["n_ctx"]) == (2, 256)
    r = complete(server, "A", 200)
    assert r.status_code == 200, r.text
    assert (r.json()["timings"]["predicted_n"], r.json()["stop_type"]) == (200, "limit")


def test_a_request_past_the_shared_context_fails_alone(server: LiveServer) -> None:
    ids = httpx.post(server.base_url + "/tokenize", json={"content": "hello world " * 150})
    long_prompt = ids.json()["tokens"][:230]  # fits -c alone, not beside 40 held tokens
    running = Stream(server, 200, after=40)
    running.start()
    assert running.ready.wait(300) and not running.done.is_set()
    refused = complete(server, long_prompt, 4)
    assert not running.done.is_set()  # the other lane was still generating
    assert refused.status_code == 500, refused.text
    error = refused.json()["error"]
    assert (error["type"], error["code"]) == ("server_error", "context_pool_exhausted")
    assert error["message"].startswith("Context size has been exceeded.")
    running.join(300)
    last = running.chunks[-1]
    assert (last["stop"], last["tokens_predicted"]) == (True, 200)
    served = complete(server, long_prompt, 4)  # the pool is free again
    assert served.status_code == 200, served.text
    assert served.json()["timings"]["predicted_n"] == 4
