"""The HTTP app on a scripted fake engine: routes, bodies, streaming chunks, auth, errors."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from kvmem.cli.api_keys import ApiKeys
from kvmem.server.app import create_app
from kvmem.server.limits import ServerLimits
from kvmem.server.settings import ServerSettings
from tests.fakes.app import PROMPT, USER, settings, sse_events, wait_ready
from tests.fakes.engine import FakeEngine, FakeInfo


@pytest.fixture()
def engine() -> FakeEngine:
    return FakeEngine(replies=["Hello there!", "Again."])


@pytest.fixture()
def client(engine: FakeEngine) -> Iterator[TestClient]:
    with TestClient(create_app(settings(alias="smol", metrics=True), lambda s: engine)) as c:
        wait_ready(c)
        yield c


def test_health_is_503_while_loading_then_200() -> None:
    release = threading.Event()

    def slow_factory(_: ServerSettings) -> FakeEngine:
        release.wait(5)
        return FakeEngine()

    with TestClient(create_app(settings(), slow_factory)) as c:
        loading = c.get("/health")
        assert loading.status_code == 503
        assert loading.json()["status"] == "loading"
        assert c.post("/v1/chat/completions", json={"messages": USER}).status_code == 503
        release.set()
        wait_ready(c)
        assert c.get("/v1/health").json() == {"status": "ok"}


def test_models_and_props(client: TestClient) -> None:
    models = client.get("/v1/models").json()
    assert models["data"][0]["id"] == "smol"
    assert models["data"][0]["meta"] == {"n_ctx": 4096, "n_ctx_train": 8192, "n_vocab": 0x110000}
    props = client.get("/props").json()
    assert props["total_slots"] == 1
    assert props["default_generation_settings"]["n_ctx"] == 4096
    assert props["model_path"] == "/models/fake-model.gguf"
    assert props["kvmem"]["budget"] == 32768
    assert (props["kvmem"]["score_mode"], props["kvmem"]["positions"]) == ("bound", "compact")
    assert props["kvmem"]["neighbor_blocks"] == 0
    assert props["auth"] == {"enabled": False}
    assert "<|im_start|>" in props["chat_template"]


def test_models_id_is_the_file_name_without_alias(engine: FakeEngine) -> None:
    with TestClient(create_app(settings(), lambda s: engine)) as c:
        wait_ready(c)
        assert c.get("/v1/models").json()["data"][0]["id"] == "fake-model.gguf"


def test_non_stream_completion_and_cached_tokens_on_the_second_turn(
    client: TestClient, engine: FakeEngine
) -> None:
    first = client.post("/v1/chat/completions", json={"messages": USER, "temperature": 0}).json()
    assert first["object"] == "chat.completion"
    assert first["model"] == "smol"
    assert first["choices"][0]["message"] == {"role": "assistant", "content": "Hello there!"}
    assert first["choices"][0]["finish_reason"] == "stop"
    assert first["usage"] == {
        "prompt_tokens": len(PROMPT),
        "completion_tokens": 12,
        "total_tokens": len(PROMPT) + 12,
        "prompt_tokens_details": {"cached_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0},
        "prompt_cache_hit_tokens": 0,
        "prompt_cache_miss_tokens": len(PROMPT),
    }
    second_msgs = USER + [
        {"role": "assistant", "content": "Hello there!"},
        {"role": "user", "content": "More"},
    ]
    second = client.post("/v1/chat/completions", json={"messages": second_msgs}).json()
    cached = len(PROMPT) + len("Hello there!")
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == cached
    assert second["usage"]["prompt_cache_hit_tokens"] == cached
    assert engine.calls[0].sampling.temperature == 0.0
    assert engine.calls[1].query is not None


def test_stream_chunks_in_openai_order_with_usage(client: TestClient) -> None:
    body = {"messages": USER, "stream": True, "stream_options": {"include_usage": True}}
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = sse_events(response.read().decode())
    assert events[-1] == "[DONE]"
    chunks = [e for e in events[:-1] if isinstance(e, dict)]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[1:-2])
    assert text == "Hello there!"
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == 12
    assert {c["id"] for c in chunks} == {chunks[0]["id"]}


def test_stream_tool_call_deltas_carry_the_id_only_first() -> None:
    reply = (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    )
    fake = FakeEngine(replies=[reply])
    tools = [
        {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
        for n in ("get_weather", "get_time")
    ]
    with TestClient(create_app(settings(), lambda s: fake)) as c:
        wait_ready(c)
        with c.stream(
            "POST", "/v1/chat/completions", json={"messages": USER, "tools": tools, "stream": True}
        ) as r:
            events = sse_events(r.read().decode())
    deltas = [
        e["choices"][0]["delta"] for e in events[1:-1] if isinstance(e, dict) and e["choices"]
    ]
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert [(c["index"], "id" in c, c["function"].get("name")) for c in calls] == [
        (0, True, "get_weather"),
        (0, False, None),
        (1, True, "get_time"),
        (1, False, None),
    ]
    assert calls[1]["function"]["arguments"] == '{"city": "Paris"}'
    assert not any(d.get("content") for d in deltas)
    assert events[-2]["choices"][0]["finish_reason"] == "tool_calls"  # type: ignore[index]
    assert "<tools>" in fake.calls[0].prompt  # the polyfilled tool instructions


def test_response_format_and_forced_tool_choice_pass_grammars() -> None:
    fake = FakeEngine(
        replies=['{"a": 1}', '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>']
    )
    tools = [{"type": "function", "function": {"name": "f"}}]
    with TestClient(create_app(settings(), lambda s: fake)) as c:
        wait_ready(c)
        r = c.post(
            "/v1/chat/completions",
            json={"messages": USER, "response_format": {"type": "json_object"}},
        )
        assert r.json()["choices"][0]["message"]["content"] == '{"a": 1}'
        r = c.post(
            "/v1/chat/completions",
            json={
                "messages": USER,
                "tools": tools,
                "tool_choice": {"type": "function", "function": {"name": "f"}},
            },
        )
        message = r.json()["choices"][0]["message"]
    assert fake.calls[0].grammar is not None and fake.calls[0].grammar.startswith("root ::= object")
    assert fake.calls[1].grammar is not None and '"<tool_call>\\n"' in fake.calls[1].grammar
    assert message["content"] is None
    assert message["tool_calls"][0]["function"] == {"name": "f", "arguments": "{}"}


def test_max_tokens_and_server_n_predict(engine: FakeEngine) -> None:
    """-n is llama-server's default: a request's own limit wins, above -n too."""
    with TestClient(create_app(settings(n_predict=8), lambda s: engine)) as c:
        wait_ready(c)
        r = c.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 5}).json()
        assert (r["choices"][0]["message"]["content"], r["choices"][0]["finish_reason"]) == (
            "Hello",
            "length",
        )
        for extra in ({"max_completion_tokens": 100}, {}, {"max_tokens": -1}):
            r = c.post("/v1/chat/completions", json={"messages": USER, **extra})
            assert r.status_code == 200
    assert [call.max_tokens for call in engine.calls] == [5, 100, 8, 8]


def test_ignore_eos_reaches_the_engine(engine: FakeEngine) -> None:
    with TestClient(create_app(settings(), lambda s: engine)) as c:
        wait_ready(c)
        body = {"messages": USER, "ignore_eos": True, "max_tokens": 4}
        assert c.post("/v1/chat/completions", json=body).status_code == 200
        assert c.post("/v1/chat/completions", json={"messages": USER}).status_code == 200
        bad = c.post("/v1/chat/completions", json={"messages": USER, "ignore_eos": "yes"})
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "ignore_eos"
    assert [call.ignore_eos for call in engine.calls] == [True, False]


def test_context_length_exceeded() -> None:
    fake = FakeEngine(info=FakeInfo(n_ctx=40))
    with TestClient(create_app(settings(), lambda s: fake)) as c:
        wait_ready(c)
        r = c.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x" * 100}]}
        )
    assert r.status_code == 400
    error = r.json()["error"]
    assert (error["code"], error["type"]) == (
        "context_length_exceeded",
        "exceed_context_size_error",
    )
    assert (error["n_ctx"], error["n_prompt_tokens"] > 40) == (40, True)
    assert fake.calls == []


def test_queue_full_gives_503_with_retry_after() -> None:
    fake = FakeEngine(replies=lambda prompt: "slow reply", token_delay_s=0.05)
    with TestClient(create_app(settings(queue_size=0), lambda s: fake)) as c:
        wait_ready(c)
        results: list[int] = []
        t = threading.Thread(
            target=lambda: results.append(
                c.post("/v1/chat/completions", json={"messages": USER}).status_code
            )
        )
        t.start()
        assert fake.started.wait(5)
        busy = c.post("/v1/chat/completions", json={"messages": USER})
        t.join()
    assert busy.status_code == 503
    assert busy.headers["retry-after"] == "1"
    assert busy.json()["error"]["code"] == "queue_full"
    assert results == [200]


def test_metrics(client: TestClient) -> None:
    client.post("/v1/chat/completions", json={"messages": USER})
    text = client.get("/metrics").text
    assert f"kvmem_prompt_tokens_total {len(PROMPT)}" in text
    assert "kvmem_generated_tokens_total 12" in text
    assert f"kvmem_prompt_cache_miss_tokens_total {len(PROMPT)}" in text
    assert "kvmem_stage_in_bytes_total 0" in text and "kvmem_reselect_seconds_total 0" in text


def test_metrics_disabled_by_default(engine: FakeEngine) -> None:
    with TestClient(create_app(settings(), lambda s: engine)) as c:
        wait_ready(c)
        r = c.get("/metrics")
    assert r.status_code == 501
    assert "--metrics" in r.json()["error"]["message"]


def test_auth_matrix(engine: FakeEngine, tmp_path: Path) -> None:
    ui = tmp_path / "ui"
    ui.mkdir()
    (ui / "index.html").write_text("<html>chat</html>")
    s = settings(
        api_keys=ApiKeys(("sk-a", "sk-b")),
        ui=True,
        ui_dir=str(ui),
        metrics=True,
        limits=ServerLimits(cors_origins=("http://example.com",)),
    )
    with TestClient(create_app(s, lambda _: engine)) as c:
        wait_ready(c)
        for path in ("/v1/models", "/props", "/metrics"):
            r = c.get(path)
            assert r.status_code == 401
            assert r.json()["error"]["type"] == "authentication_error"
        denied = c.post("/v1/chat/completions", json={"messages": USER})
        assert denied.status_code == 401 and denied.json()["error"]["code"] == "invalid_api_key"
        assert (
            c.post(
                "/v1/chat/completions",
                json={"messages": USER},
                headers={"Authorization": "Bearer sk-nope"},
            ).status_code
            == 401
        )
        assert (
            c.post(
                "/v1/chat/completions",
                json={"messages": USER},
                headers={"Authorization": "Bearer sk-b"},
            ).status_code
            == 200
        )
        assert c.get("/v1/models", headers={"X-Api-Key": "sk-a"}).status_code == 200
        assert c.get("/health").status_code == 200 and c.get("/v1/health").status_code == 200
        preflight = c.options(
            "/v1/chat/completions",
            headers={"Origin": "http://example.com", "Access-Control-Request-Method": "POST"},
        )
        assert preflight.status_code == 200
        assert c.get("/").text == "<html>chat</html>"
        assert c.get("/props", headers={"X-Api-Key": "sk-a"}).json()["auth"] == {"enabled": True}
        assert "sk-a" not in c.get("/props", headers={"X-Api-Key": "sk-a"}).text


def test_unknown_route_uses_the_envelope(client: TestClient) -> None:
    r = client.get("/v1/nothing")
    assert r.status_code == 404
    assert r.json()["error"]["type"] == "not_found_error"


def test_a_re_rendered_history_is_reused_up_to_the_first_changed_byte() -> None:
    # A Qwen3-style template drops the thinking of earlier assistant turns, so the second
    # prompt differs from the session history right after the first assistant header.
    template = (
        "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|><think>\n{% endif %}"
    )
    fake = FakeEngine(replies=["plan</think>Answer.", "Fine."])
    with TestClient(create_app(settings(chat_template=template), lambda s: fake)) as c:
        wait_ready(c)
        first = c.post("/v1/chat/completions", json={"messages": USER}).json()
        assert first["choices"][0]["message"] == {
            "role": "assistant",
            "content": "Answer.",
            "reasoning_content": "plan",
        }
        history = USER + [
            {"role": "assistant", "content": "Answer."},
            {"role": "user", "content": "ok"},
        ]
        second = c.post("/v1/chat/completions", json={"messages": history}).json()
    first_prompt = "<|user|>Hi<|end|><|assistant|><think>\n"
    second_prompt = (
        "<|user|>Hi<|end|><|assistant|>Answer.<|end|><|user|>ok<|end|><|assistant|><think>\n"
    )
    assert [call.prompt for call in fake.calls] == [first_prompt, second_prompt]
    divergence = len("<|user|>Hi<|end|><|assistant|>")
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == divergence
    assert second["usage"]["prompt_cache_miss_tokens"] == len(second_prompt) - divergence
