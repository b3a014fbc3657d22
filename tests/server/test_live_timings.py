"""`timings_per_token` on the real server: every streamed chunk after the role chunk carries
llama-server's `timings`, counting the tokens generated so far."""

from __future__ import annotations

import json

import pytest

from tests.server.conftest import LiveServer

pytestmark = pytest.mark.slow


def _data(text: str) -> list[dict]:
    return [
        json.loads(line[len("data: ") :])
        for line in text.splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]


def test_chat_and_completion_streams_carry_timings_per_token(main_server: LiveServer) -> None:
    with main_server.http() as http:
        chat = http.post(
            "/v1/chat/completions",
            json={
                "messages": [{"role": "user", "content": "Count to five."}],
                "max_tokens": 6,
                "temperature": 0,
                "stream": True,
                "timings_per_token": True,
                "stream_options": {"include_usage": True},
            },
        )
        native = http.post(
            "/completion",
            json={"prompt": "One, two,", "n_predict": 5, "stream": True, "timings_per_token": True},
        )
    chunks = _data(chat.text)
    assert "timings" not in chunks[0] and chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    live = [c["timings"]["predicted_n"] for c in chunks[1:]]
    assert live == sorted(live) and live[0] >= 1 and live[-1] == 6
    assert all(c["timings"]["predicted_n"] <= 6 for c in chunks[1:])
    assert chunks[-1]["usage"]["completion_tokens"] == 6
    assert all("predicted_per_second" in c["timings"] for c in chunks[1:])
    tokens = _data(native.text)
    assert [t["timings"]["predicted_n"] for t in tokens[:-1]] == [1, 2, 3, 4, 5]
    assert tokens[-1]["stop"] is True and tokens[-1]["timings"]["predicted_n"] == 5
