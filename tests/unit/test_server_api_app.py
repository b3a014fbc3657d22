"""Responses, Anthropic Messages and timings_per_token through the HTTP app on the fake
engine: the reasoning split into reasoning items / thinking blocks, the thinking controls
reaching the template, and the per-chunk timings."""

from __future__ import annotations

import json

from fastapi.testclient import TestClient

from kvmem.cli.api_keys import ApiKeys
from kvmem.server.app import create_app
from kvmem.server.limits import ServerLimits
from tests.fakes.app import USER, settings, sse_events, wait_ready
from tests.fakes.engine import FakeEngine

THINKING_TEMPLATE = (
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>"
    "{% if enable_thinking is defined and not enable_thinking %}<think></think>"
    "{% else %}<think>\n{% endif %}{% endif %}"
)
OPEN = "<|user|>Hi<|end|><|assistant|><think>\n"
CLOSED = "<|user|>Hi<|end|><|assistant|><think></think>"


def _client(fake: FakeEngine, **kw: object) -> TestClient:
    return TestClient(create_app(settings(chat_template=THINKING_TEMPLATE, **kw), lambda s: fake))


def _named_events(text: str) -> list[dict]:
    out = []
    for block in text.strip().split("\n\n"):
        name, data = block.split("\n", 1)
        body = json.loads(data.removeprefix("data: "))
        assert name == f"event: {body['type']}"
        out.append(body)
    return out


def test_anthropic_thinking_blocks_and_disabled_thinking() -> None:
    fake = FakeEngine(replies=["plan</think>Answer.", "Answer.", "plan</think>Hi!"])
    with _client(fake) as c:
        wait_ready(c)
        body = {"model": "m", "max_tokens": 50, "messages": USER}
        message = c.post(
            "/v1/messages", json={**body, "thinking": {"type": "enabled", "budget_tokens": 20}}
        ).json()
        assert message["content"] == [
            {"type": "thinking", "thinking": "plan", "signature": ""},
            {"type": "text", "text": "Answer."},
        ]
        assert message["stop_reason"] == "end_turn"
        off = c.post("/v1/messages", json={**body, "thinking": {"type": "disabled"}}).json()
        assert off["content"] == [{"type": "text", "text": "Answer."}]
        stream = c.post("/v1/messages", json={**body, "stream": True})
        events = _named_events(stream.text)
    assert [call.prompt for call in fake.calls] == [OPEN, CLOSED, OPEN]
    starts = [e["content_block"] for e in events if e["type"] == "content_block_start"]
    assert starts == [
        {"type": "thinking", "thinking": "", "signature": ""},
        {"type": "text", "text": ""},
    ]
    deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
    assert "".join(d.get("thinking", "") for d in deltas) == "plan"
    assert "".join(d.get("text", "") for d in deltas) == "Hi!"


def test_responses_reasoning_item_and_effort_none() -> None:
    fake = FakeEngine(replies=["plan</think>Answer.", "Answer."])
    with _client(fake) as c:
        wait_ready(c)
        first = c.post("/v1/responses", json={"input": "Hi"}).json()
        assert [(i["type"], i["status"]) for i in first["output"]] == [
            ("reasoning", "completed"),
            ("message", "completed"),
        ]
        assert first["output"][0]["content"] == [{"type": "reasoning_text", "text": "plan"}]
        assert first["output"][1]["content"][0]["text"] == "Answer."
        assert first["usage"]["output_tokens_details"]["reasoning_tokens"] == len("plan</think>")
        off = c.post("/v1/responses", json={"input": "Hi", "reasoning": {"effort": "none"}}).json()
        assert [i["type"] for i in off["output"]] == ["message"]
        assert off["reasoning"] == {"effort": "none", "summary": None}
    assert [call.prompt for call in fake.calls] == [OPEN, CLOSED]


def test_previous_response_keeps_the_reasoning_out_of_the_rendered_history() -> None:
    fake = FakeEngine(replies=["plan</think>Answer.", "Fine."])
    with _client(fake) as c:
        wait_ready(c)
        first = c.post("/v1/responses", json={"input": "Hi"}).json()
        second = c.post(
            "/v1/responses", json={"input": "ok", "previous_response_id": first["id"]}
        ).json()
        assert second["status"] == "completed"
        unstored = c.post("/v1/responses", json={"input": "x", "store": False}).json()
        missing = c.post(
            "/v1/responses", json={"input": "y", "previous_response_id": unstored["id"]}
        )
        assert missing.status_code == 404
        assert c.get(f"/v1/responses/{first['id']}").json() == first
    assert fake.calls[1].prompt == (
        "<|user|>Hi<|end|><|assistant|>Answer.<|end|><|user|>ok<|end|><|assistant|><think>\n"
    )


class LiveFake(FakeEngine):
    """A fake that publishes the running turn's statistics, as the engine's hook does."""

    @property
    def live_turn(self) -> object:
        return self.last_turn


def _timed_chunks(c: TestClient, path: str, body: dict) -> list[dict]:
    r = c.post(path, json={**body, "stream": True, "timings_per_token": True})
    assert r.status_code == 200
    return [e for e in sse_events(r.text) if isinstance(e, dict)]


def test_timings_per_token_on_chat_and_completion_streams() -> None:
    fake = LiveFake(replies=["Hello", "Hello", "Hello"])
    with TestClient(create_app(settings(), lambda s: fake)) as c:
        wait_ready(c)
        chunks = _timed_chunks(c, "/v1/chat/completions", {"messages": USER})
        assert "timings" not in chunks[0]  # the role chunk comes before any token
        live = [c_["timings"] for c_ in chunks[1:-1]]
        assert [t["predicted_n"] for t in live] == [1, 2, 3, 4, 5]
        prompt = chunks[-1]["timings"]["prompt_n"]
        assert all(t["cache_n"] + t["prompt_n"] == prompt for t in live)
        assert set(live[0]) == set(chunks[-1]["timings"])  # every llama-server field
        assert chunks[-1]["timings"]["predicted_n"] == 5
        plain = sse_events(
            c.post("/v1/chat/completions", json={"messages": USER, "stream": True}).text
        )
        assert plain[-1] == "[DONE]" and "timings" in plain[-2]  # the final chunk only
        assert not any("timings" in e for e in plain[:-2])  # type: ignore[operator]
        native = _timed_chunks(c, "/completion", {"prompt": "Hi"})
        assert [t["timings"]["predicted_n"] for t in native[:-1]] == [1, 2, 3, 4, 5]
        assert native[-1]["stop"] is True and native[-1]["timings"]["predicted_n"] == 5


def test_timings_per_token_without_the_engine_hook_has_generation_fields() -> None:
    fake = FakeEngine(replies=["Hey"])
    with TestClient(create_app(settings(), lambda s: fake)) as c:
        wait_ready(c)
        chunks = _timed_chunks(c, "/v1/chat/completions", {"messages": USER})
    assert set(chunks[1]["timings"]) == {
        "prompt_ms",
        "predicted_n",
        "predicted_ms",
        "predicted_per_token_ms",
        "predicted_per_second",
    }


def test_anthropic_errors_use_its_envelope_everywhere() -> None:
    fake = FakeEngine(replies=["ok"])
    app = create_app(
        settings(api_keys=ApiKeys(("sk-a",)), limits=ServerLimits(max_body_bytes=2000)),
        lambda s: fake,
    )
    body = {"model": "m", "max_tokens": 5, "messages": USER}
    key = {"x-api-key": "sk-a"}
    with TestClient(app) as c:
        wait_ready(c)
        missing = c.post("/v1/messages", json=body)
        assert (missing.status_code, missing.json()) == (
            401,
            {
                "type": "error",
                "error": {
                    "type": "authentication_error",
                    "message": "missing API key: send 'Authorization: Bearer YOUR_KEY' or "
                    "'X-Api-Key: YOUR_KEY'",
                },
            },
        )
        bearer = c.post("/v1/messages", json=body, headers={"authorization": "Bearer sk-a"})
        assert bearer.status_code == 200
        big = c.post("/v1/messages", json={**body, "system": "x" * 3000}, headers=key)
        assert big.status_code == 413
        assert big.json()["error"]["type"] == "request_too_large"
        text = c.post("/v1/messages", content=b"{}", headers={**key, "content-type": "text/plain"})
        assert text.status_code == 415 and text.json()["type"] == "error"
        broken = c.post(
            "/v1/messages", content=b"{", headers={**key, "content-type": "application/json"}
        )
        assert broken.status_code == 400
        assert broken.json()["error"]["type"] == "invalid_request_error"
        # the OpenAI routes keep the OpenAI envelope
        other = c.post("/v1/responses", json={"input": 1}, headers=key)
        assert other.status_code == 400 and other.json()["error"]["param"] == "input"
        assert c.get("/v1/responses/resp_nope", headers=key).status_code == 404
        counted = c.post(
            "/v1/messages/count_tokens", json={"model": "m", "messages": USER}, headers=key
        )
        assert counted.json() == {
            "input_tokens": len("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
        }


def test_request_fields_reach_the_engine() -> None:
    fake = FakeEngine(replies=lambda prompt: "{}")
    tool = {"name": "f", "input_schema": {"type": "object", "properties": {}}}
    with TestClient(create_app(settings(), lambda s: fake)) as c:
        wait_ready(c)
        schema = {"type": "json_schema", "name": "x", "schema": {"type": "object"}}
        r = c.post(
            "/v1/responses",
            json={"input": "Hi", "max_output_tokens": 7, "top_p": 0.5, "text": {"format": schema}},
        )
        assert r.status_code == 200 and r.json()["text"] == {"format": schema}
        m = c.post(
            "/v1/messages",
            json={
                "model": "m",
                "max_tokens": 9,
                "messages": USER,
                "top_k": 3,
                "tools": [tool],
                "tool_choice": {"type": "any"},
            },
        )
        assert m.status_code == 200
        none = c.post(
            "/v1/messages",
            json={
                "model": "m",
                "max_tokens": 9,
                "messages": USER,
                "tools": [tool],
                "tool_choice": {"type": "none"},
            },
        )
        assert none.status_code == 200
    first, second, third = fake.calls
    assert (first.max_tokens, first.sampling.top_p) == (7, 0.5)
    assert first.grammar is not None and first.grammar.startswith("root ::= object")
    assert (second.max_tokens, second.sampling.top_k) == (9, 3)
    assert second.grammar is not None and '"<tool_call>\\n"' in second.grammar
    assert "<tools>" in second.prompt  # the tool instructions of the template's polyfill
    assert third.grammar is None and "<tools>" not in third.prompt  # tool_choice none
