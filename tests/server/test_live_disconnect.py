"""A non-stream request whose client goes away is cancelled while tokens flow
(llama.cpp's test_cancel_request: a 0.1 s client timeout and `n_predict: -1`)."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.server.conftest import LiveServer, start_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    live = start_server(["-c", "4096", "-t", "2"], tmp_path_factory.mktemp("disconnect"))
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
