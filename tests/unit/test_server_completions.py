"""Text completion and the utility endpoints on the fake engine (one character = one token)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from kvmem.server.app import create_app
from tests.fakes.app import PROMPT, USER, settings, sse_events, wait_ready
from tests.fakes.engine import FakeEngine


@pytest.fixture()
def engine() -> FakeEngine:
    return FakeEngine(replies=lambda prompt: "Paris.\nYes")


@pytest.fixture()
def client(engine: FakeEngine) -> Iterator[TestClient]:
    with TestClient(create_app(settings(alias="smol", n_predict=64), lambda s: engine)) as c:
        wait_ready(c)
        yield c


def test_completion_non_stream_and_stream(client: TestClient, engine: FakeEngine) -> None:
    body = client.post("/completion", json={"prompt": "Capital?", "n_predict": 5}).json()
    assert (body["content"], body["stop_type"], body["tokens_predicted"]) == ("Paris", "limit", 5)
    assert body["tokens_evaluated"] == 8 and body["prompt"] == "Capital?"
    assert body["generation_settings"]["n_predict"] == 5 and body["tokens"] == []
    assert engine.calls[-1].prompt == "Capital?" and engine.calls[-1].max_tokens == 5
    events = sse_events(
        client.post("/completion", json={"prompt": "Capital?", "stream": True}).text
    )
    assert [e["content"] for e in events[:-1]] == list("Paris.\nYes")  # type: ignore[index]
    assert [e["tokens"] for e in events[:2]] == [[ord("P")], [ord("a")]]  # type: ignore[index]
    final = events[-1]
    assert final["stop"] is True and final["stop_type"] == "eos"  # type: ignore[index]
    assert final["has_new_line"] is True and final["timings"]["cache_n"] == 8  # type: ignore[index]


def test_stop_word_batch_tokens_and_fields(client: TestClient, engine: FakeEngine) -> None:
    r = client.post("/completion", json={"prompt": "Q", "stop": ["."], "return_tokens": True})
    body = r.json()
    assert (body["content"], body["stop_type"], body["stopping_word"]) == ("Paris", "word", ".")
    assert body["tokens"] == [ord(c) for c in "Paris."]
    batch = client.post("/completion", json={"prompt": [[81, 82], "QR"], "n_predict": 2}).json()
    assert [b["content"] for b in batch] == ["Pa", "Pa"] and [b["index"] for b in batch] == [0, 1]
    assert [c.prompt for c in engine.calls[-2:]] == ["QR", "QR"]
    picked = client.post(
        "/completion",
        json={
            "prompt": "Q",
            "n_predict": 3,
            "response_fields": ["content", "generation_settings/n_predict"],
        },
    ).json()
    assert picked == {"content": "Par", "generation_settings/n_predict": 3}


def test_server_n_predict_is_the_default_not_a_cap(client: TestClient, engine: FakeEngine) -> None:
    """llama-server's rule (server-context.cpp: `n_predict_max = task.params.n_predict !=
    -1 ? task.params.n_predict : params_base.n_predict`): the request's own n_predict or
    max_tokens, even above the server's -n 64; none or -1: -n."""
    asks = [
        ("/completion", {"n_predict": 100}),
        ("/completion", {"max_tokens": 80}),
        ("/completion", {}),
        ("/completion", {"n_predict": -1}),
        ("/v1/completions", {"max_tokens": 90}),
        ("/v1/completions", {"max_tokens": -1}),
    ]
    for path, extra in asks:
        assert client.post(path, json={"prompt": "Q", **extra}).status_code == 200
    assert [c.max_tokens for c in engine.calls] == [100, 80, 64, 64, 90, 64]


def test_v1_completions_openai_shape(client: TestClient) -> None:
    body = client.post("/v1/completions", json={"prompt": "Q", "max_tokens": 3}).json()
    assert body["object"] == "text_completion" and body["system_fingerprint"].startswith("b")
    assert body["choices"] == [
        {"text": "Par", "index": 0, "logprobs": None, "finish_reason": "length"}
    ]
    assert body["usage"]["completion_tokens"] == 3
    events = sse_events(client.post("/v1/completions", json={"prompt": "Q", "stream": True}).text)
    assert events[-1] == "[DONE]"
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == "Paris.\nYes"  # type: ignore[index]
    assert events[-2]["choices"][0]["finish_reason"] == "stop"  # type: ignore[index]


def test_tokenize_detokenize_apply_template_input_tokens_slots(client: TestClient) -> None:
    assert client.post("/tokenize", json={"content": "ab"}).json() == {"tokens": [97, 98]}
    pieces = client.post("/tokenize", json={"content": "a", "with_pieces": True}).json()
    assert pieces == {"tokens": [{"id": 97, "piece": "a"}]}
    assert client.post("/detokenize", json={"tokens": [104, 105]}).json() == {"content": "hi"}
    assert client.post("/apply-template", json={"messages": USER}).json() == {"prompt": PROMPT}
    counted = client.post("/chat/completions/input_tokens", json={"messages": USER}).json()
    assert counted == {"input_tokens": len(PROMPT)}
    slots = client.get("/slots").json()
    assert slots == [
        {
            "id": 0,
            "id_task": -1,
            "n_ctx": 4096,
            "speculative": False,
            "is_processing": False,
            "kvmem": True,
        }
    ]
    assert client.post("/slots/0?action=save", json={}).status_code == 501


def test_no_slots_flag_disables_the_endpoint(engine: FakeEngine) -> None:
    with TestClient(create_app(settings(slots_endpoint=False), lambda s: engine)) as c:
        wait_ready(c)
        r = c.get("/slots")
    assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error"


def test_prefill_n_choices_and_verbose(client: TestClient, engine: FakeEngine) -> None:
    messages = [
        *USER,
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}],
        },
    ]
    body = client.post(
        "/v1/chat/completions",
        json={"messages": messages, "max_tokens": 2, "n": 2, "verbose": True},
    ).json()
    assert body["__verbose"]["prompt"] == PROMPT + "A\n\nB"
    assert [c["message"]["content"] for c in body["choices"]] == ["Pa", "Pa"]
    assert body["usage"]["completion_tokens"] == 4


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/completion", {"n_predict": 3}, "prompt"),
        ("/completion", {"prompt": "x", "n_predict": -5}, "n_predict"),
        ("/completion", {"prompt": [True]}, "prompt"),
        ("/completion", {"prompt": "x", "logit_bias": {"97": 5}}, "logit_bias"),
        ("/completion", {"prompt": "x", "grammar": "g", "json_schema": {}}, "grammar"),
        ("/v1/completions", {"prompt": "x", "suffix": "y"}, "suffix"),
        ("/v1/completions", {"prompt": "x", "logprobs": 50}, "logprobs"),
        ("/tokenize", {"content": 5}, "prompt"),
        ("/detokenize", {"tokens": [-1]}, "tokens"),
        ("/apply-template", {"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ],
)
def test_bad_input_gets_a_400_envelope(
    client: TestClient, path: str, body: dict, param: str
) -> None:
    r = client.post(path, json=body)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param


def test_cache_prompt_false_recomputes_the_whole_prompt(client: TestClient) -> None:
    first = client.post("/completion", json={"prompt": "Capital?", "n_predict": 2}).json()
    again = client.post("/completion", json={"prompt": "Capital?", "n_predict": 2}).json()
    fresh = client.post(
        "/completion", json={"prompt": "Capital?", "n_predict": 2, "cache_prompt": False}
    ).json()
    assert first["timings"]["cache_n"] == 0
    assert again["timings"]["cache_n"] > 0
    assert (fresh["timings"]["cache_n"], fresh["timings"]["prompt_n"]) == (0, 8)
