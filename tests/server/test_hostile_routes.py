"""Every route bounded before it works (issue 28), against a real kvmem-server process:
big prompts and id lists to the routes that tokenize are refused at once by the size
pre-check (they used to freeze every route for up to a minute), /health answers within a
second while they are handled, and a greedy answer is unchanged afterwards."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.server.conftest import LiveServer
from tests.server.hostile_helpers import fresh_answer, normal_answer, start_limited

pytestmark = pytest.mark.slow

ARGS = ("-c", "2048", "-t", "1", "--no-ui", "--max-body-size", "64M")
BIG = "The grass is green. " * 400_000  # 8 MB
BIG_MESSAGES = {"messages": [{"role": "user", "content": BIG}]}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = start_limited(ARGS, tmp_path_factory.mktemp("hostile-routes"))
    yield live
    assert live.stop() == 0, live.log()[-3000:]


@pytest.fixture(scope="module")
def expected_normal(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A fresh server's greedy answer: the shared server must still give it after each case."""
    return fresh_answer(ARGS, tmp_path_factory.mktemp("fresh"))


@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("/completion", {"prompt": BIG, "n_predict": 4}),
        ("/v1/completions", {"prompt": BIG, "max_tokens": 4}),
        ("/tokenize", {"content": BIG}),
        ("/detokenize", {"tokens": [1] * 1_000_000}),
        ("/apply-template", BIG_MESSAGES),
        ("/v1/chat/completions/input_tokens", BIG_MESSAGES),
        ("/v1/chat/completions", {**BIG_MESSAGES, "max_tokens": 4}),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_big_request_is_refused_at_once_and_health_answers(
    server: LiveServer, expected_normal: str, route: str, body: dict
) -> None:
    result: dict[str, object] = {}

    def send() -> None:
        started = time.monotonic()
        r = httpx.post(server.base_url + route, json=body, timeout=120)
        result.update(status=r.status_code, body=r.json(), seconds=time.monotonic() - started)

    sender = threading.Thread(target=send)
    sender.start()
    slowest = 0.0
    while sender.is_alive():
        started = time.monotonic()
        assert httpx.get(server.base_url + "/health", timeout=5).status_code == 200
        slowest = max(slowest, time.monotonic() - started)
        time.sleep(0.05)
    sender.join()
    assert result["status"] == 400, result
    error = result["body"]["error"]  # type: ignore[index]
    assert error["type"] == "exceed_context_size_error"
    assert (
        error["message"].endswith("more than the context size of 2048 tokens")
        or error["message"]
        == "the request (1000000 tokens) exceeds the available context size (2048 tokens)"
    )
    assert result["seconds"] < 15  # the JSON body itself is parsed: the rest is a pre-check
    assert slowest < 1.0
    assert normal_answer(server) == expected_normal


def test_tokenize_ids_outside_the_vocabulary(server: LiveServer) -> None:
    for bad in (-1, 49152, 10**12):
        r = httpx.post(server.base_url + "/tokenize", json={"content": [bad]}, timeout=30)
        assert r.status_code == 400
        assert r.json()["error"]["message"] == (
            f"token id {bad} is out of range (vocabulary of 49152)"
        )


def test_completion_temperature_is_capped_like_chat(server: LiveServer) -> None:
    r = httpx.post(
        server.base_url + "/completion", json={"prompt": "x", "temperature": 1e308}, timeout=30
    )
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "temperature"
    assert "less than or equal to 100" in r.json()["error"]["message"]
