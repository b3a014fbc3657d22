"""`return_progress` on the real server: llama-server's `prompt_progress` chunks, one as the
prompt's processing starts (processed == cache) and one per prefill chunk of `-b` tokens,
on /completion, /v1/completions and /v1/chat/completions; the Anthropic and Responses APIs
refuse the field with a 400 in their own error format. The same server's `-n` is the
limit of every reply that sets none, as llama-server's is (a request's own max_tokens wins,
above `-n` too)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server.conftest import LiveServer, start_server

pytestmark = pytest.mark.slow

BATCH = 32
CAP = 3  # the server's -n: the tokens of a reply that sets no limit
TEXT = "This is a test. " * 20


@pytest.fixture(scope="module")
def small_batch_server(server_logs: Path) -> Iterator[LiveServer]:
    # a context smaller than KVMem's protected tiers (sink + recent + 1 blocks = 512 tokens):
    # the prefill still runs in chunks of -b tokens, not one token at a time
    args = ["-c", "256", "-b", str(BATCH), "-ub", str(BATCH), "-t", "2", "-n", str(CAP)]
    server = start_server(args, server_logs)
    yield server
    assert server.stop() == 0, server.log()[-3000:]


def _data(text: str) -> list[dict]:
    return [
        json.loads(line[len("data: ") :])
        for line in text.splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]


def _progress(chunks: list[dict]) -> list[dict]:
    return [c["prompt_progress"] for c in chunks if "prompt_progress" in c]


def test_completion_progress_one_chunk_per_batch(small_batch_server: LiveServer) -> None:
    with small_batch_server.http() as http:
        n = len(http.post("/tokenize", json={"content": TEXT}).json()["tokens"])
        body = {"prompt": TEXT, "n_predict": 1, "stream": True, "return_progress": True}
        native = _data(http.post("/completion", json={**body, "cache_prompt": False}).text)
        oai = _data(http.post("/v1/completions", json={**body, "max_tokens": 1}).text)
    steps = _progress(native)
    assert [s["processed"] for s in steps] == [0, *range(BATCH, n, BATCH), n]
    assert len(steps) == 1 + math.ceil(n / BATCH)
    assert {(s["total"], s["cache"]) for s in steps} == {(n, 0)}
    assert [s["time_ms"] for s in steps] == sorted(s["time_ms"] for s in steps)
    first = next(c for c in native if "prompt_progress" in c)
    assert first == {
        "index": 0,
        "content": "",
        "tokens": [],
        "stop": False,
        "id_slot": 0,
        "prompt_progress": steps[0],
    }
    assert native[-1]["stop"] is True and "prompt_progress" not in native[-1]
    again = _progress(oai)  # the same prompt: all but its last token reused
    assert [(s["cache"], s["processed"], s["total"]) for s in again] == [
        (n - 1, n - 1, n),
        (n - 1, n, n),
    ]
    assert oai[0]["object"] == "text_completion"
    assert oai[0]["choices"] == [{"text": "", "index": 0, "logprobs": None, "finish_reason": None}]


def test_progress_chunks_carry_timings_with_timings_per_token(
    small_batch_server: LiveServer,
) -> None:
    body = {"prompt": TEXT, "n_predict": 1, "stream": True, "return_progress": True}
    with small_batch_server.http() as http:
        native = _data(
            http.post(
                "/completion", json={**body, "cache_prompt": False, "timings_per_token": True}
            ).text
        )
    chunks = [c for c in native if "prompt_progress" in c]
    assert len(chunks) > 1
    timings = [c["timings"] for c in chunks]
    assert timings[0]["prompt_n"] == 0 and timings[0]["prompt_ms"] == 0.0
    assert [t["prompt_n"] for t in timings] == [c["prompt_progress"]["processed"] for c in chunks]
    assert [t["prompt_ms"] for t in timings] == sorted(t["prompt_ms"] for t in timings)
    assert timings[-1]["prompt_ms"] > 0 and {t["predicted_n"] for t in timings} == {0}


def test_chat_progress_chunks_are_role_deltas(small_batch_server: LiveServer) -> None:
    body = {
        "messages": [{"role": "user", "content": TEXT}],
        "max_tokens": 1,
        "temperature": 0,
        "stream": True,
        "return_progress": True,
        "stream_options": {"include_usage": True},
    }
    with small_batch_server.http() as http:
        first = _data(http.post("/v1/chat/completions", json=body).text)
        second = _data(http.post("/v1/chat/completions", json=body).text)
        plain = _data(
            http.post("/v1/chat/completions", json={**body, "return_progress": False}).text
        )
    n = first[-1]["usage"]["prompt_tokens"]
    steps = _progress(first)
    cache = steps[0]["cache"]
    assert steps[0]["processed"] == cache < n
    # chunks follow the -b grid of absolute positions from the reused prefix on
    grid = list(range((cache // BATCH + 1) * BATCH, n, BATCH))
    assert [s["processed"] for s in steps] == [cache, *grid, n]
    progress_chunks = [c for c in first if "prompt_progress" in c]
    assert all(
        c["choices"]
        == [
            {
                "index": 0,
                "delta": {"role": "assistant", "content": None},
                "logprobs": None,
                "finish_reason": None,
            }
        ]
        for c in progress_chunks
    )
    assert [(s["cache"], s["processed"]) for s in _progress(second)] == [(n - 1, n - 1), (n - 1, n)]
    assert _progress(plain) == []


@pytest.mark.parametrize(
    ("path", "body", "where"),
    [
        (
            "/v1/messages",
            {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
            "anthropic",
        ),
        ("/v1/responses", {"input": "hi"}, "openai"),
    ],
)
def test_return_progress_refused_where_the_stream_has_no_place_for_it(
    small_batch_server: LiveServer, path: str, body: dict, where: str
) -> None:
    with small_batch_server.http() as http:
        r = http.post(path, json={**body, "stream": True, "return_progress": True})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert "return_progress" in error["message"]
    if where == "anthropic":
        assert r.json()["type"] == "error"
    else:
        assert error["param"] == "return_progress"


def test_server_n_predict_is_the_default_of_every_reply(small_batch_server: LiveServer) -> None:
    ask = {"messages": [{"role": "user", "content": "Tell me a story."}], "temperature": 0}
    with small_batch_server.http() as http:
        props = http.get("/props").json()["default_generation_settings"]["params"]
        replies = [
            http.post("/v1/chat/completions", json={**ask, **extra}).json()
            for extra in (
                {},
                {"max_tokens": 2},
                {"max_tokens": 8, "ignore_eos": True},
                {"max_tokens": -1, "ignore_eos": True},
            )
        ]
    assert props["n_predict"] == CAP
    assert [r["usage"]["completion_tokens"] for r in replies] == [CAP, 2, 8, CAP]
    assert {r["choices"][0]["finish_reason"] for r in replies} == {"length"}
