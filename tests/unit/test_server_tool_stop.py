"""A tool-call reply with run-on text through the HTTP app on the fake engine (issue 29):
chat completions (plain and streamed), Responses and Anthropic Messages end at the call,
report it as the only output after the leading text, in generation order, with the
completion tokens counted up to the stop; `parallel_tool_calls: false` keeps one call; a
tools request without max_tokens gets `--tool-max-tokens`."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from kvmem.server.app import create_app
from tests.fakes.app import USER, settings, sse_events, wait_ready
from tests.fakes.engine import FakeEngine

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
ANTHROPIC_TOOLS = [{"name": "get_weather", "input_schema": TOOLS[0]["function"]["parameters"]}]
LEAD = "Let me check.\n"
TAGGED = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
OSLO = TAGGED.replace("Paris", "Oslo")
RUN_ON = '\n{"name": "get_weather_args", "type": "object", "properties": {}}\n' * 4
REPLY = LEAD + TAGGED + RUN_ON
STOPPED_AT = len(LEAD + TAGGED + '\n{"name": "get_weather_')  # one token per character


@pytest.fixture()
def engine() -> FakeEngine:
    return FakeEngine(replies=lambda prompt: REPLY)


@pytest.fixture()
def client(engine: FakeEngine) -> Iterator[TestClient]:
    with TestClient(create_app(settings(), lambda s: engine)) as c:
        wait_ready(c)
        yield c


def _named(text: str) -> list[dict]:
    return [
        json.loads(b.split("\n", 1)[1].removeprefix("data: ")) for b in text.strip().split("\n\n")
    ]


def test_chat_completion_ends_at_the_call(client: TestClient, engine: FakeEngine) -> None:
    body = client.post("/v1/chat/completions", json={"messages": USER, "tools": TOOLS}).json()
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Let me check."
    calls = choice["message"]["tool_calls"]
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
        ("get_weather", '{"city": "Paris"}')
    ]
    assert body["usage"]["completion_tokens"] == STOPPED_AT
    assert engine.last_turn.generated_tokens == STOPPED_AT


def test_streamed_chat_completion_sends_no_run_on(client: TestClient) -> None:
    with client.stream(
        "POST",
        "/v1/chat/completions",
        json={
            "messages": USER,
            "tools": TOOLS,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    ) as r:
        events = [e for e in sse_events(r.read().decode()) if isinstance(e, dict)]
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    assert "".join(d.get("content") or "" for d in deltas) == LEAD
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert [
        (c["index"], c["function"].get("name"), c["function"].get("arguments")) for c in calls
    ] == [
        (0, "get_weather", ""),
        (0, None, '{"city": "Paris"}'),
    ]
    last_content = max(i for i, d in enumerate(deltas) if d.get("content"))
    assert last_content < min(i for i, d in enumerate(deltas) if "tool_calls" in d)
    assert [e["choices"][0]["finish_reason"] for e in events if e["choices"]][-1] == "tool_calls"
    assert events[-1]["usage"]["completion_tokens"] == STOPPED_AT


def test_parallel_tool_calls_false_keeps_the_first_call(engine: FakeEngine) -> None:
    two = FakeEngine(replies=lambda prompt: f"{TAGGED}\n{OSLO}")
    with TestClient(create_app(settings(), lambda s: two)) as c:
        wait_ready(c)
        both = c.post("/v1/chat/completions", json={"messages": USER, "tools": TOOLS}).json()
        one = c.post(
            "/v1/chat/completions",
            json={"messages": USER, "tools": TOOLS, "parallel_tool_calls": False},
        ).json()
    cities = [
        [
            json.loads(t["function"]["arguments"])["city"]
            for t in b["choices"][0]["message"]["tool_calls"]
        ]
        for b in (both, one)
    ]
    assert cities == [["Paris", "Oslo"], ["Paris"]]
    assert one["usage"]["completion_tokens"] == len(TAGGED)
    assert both["usage"]["completion_tokens"] == len(TAGGED) + 1 + len(OSLO)


def test_responses_output_is_the_text_then_the_call(client: TestClient) -> None:
    tools = [
        {
            "type": "function",
            "name": "get_weather",
            "parameters": TOOLS[0]["function"]["parameters"],
        }
    ]
    body = client.post("/v1/responses", json={"input": "Hi", "tools": tools}).json()
    kinds = [item["type"] for item in body["output"]]
    assert kinds == ["message", "function_call"]
    assert body["output"][0]["content"][0]["text"] == LEAD
    assert (body["output"][1]["name"], body["output"][1]["arguments"]) == (
        "get_weather",
        '{"city": "Paris"}',
    )
    assert body["usage"]["output_tokens"] == STOPPED_AT


def test_anthropic_blocks_follow_generation_order(client: TestClient) -> None:
    req = {"model": "m", "max_tokens": 500, "messages": USER, "tools": ANTHROPIC_TOOLS}
    body = client.post("/v1/messages", json=req).json()
    assert [b["type"] for b in body["content"]] == ["text", "tool_use"]
    assert body["content"][0]["text"] == LEAD
    assert (body["content"][1]["name"], body["content"][1]["input"]) == (
        "get_weather",
        {"city": "Paris"},
    )
    assert (body["stop_reason"], body["usage"]["output_tokens"]) == ("tool_use", STOPPED_AT)
    with client.stream("POST", "/v1/messages", json={**req, "stream": True}) as r:
        events = _named(r.read().decode())
    starts = [
        (e["index"], e["content_block"]["type"])
        for e in events
        if e["type"] == "content_block_start"
    ]
    assert starts == [(0, "text"), (1, "tool_use")]
    text = "".join(e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta")
    assert text == LEAD
    assert [e for e in events if e["type"] == "message_delta"][0]["delta"][
        "stop_reason"
    ] == "tool_use"


def test_anthropic_disable_parallel_tool_use_keeps_one_call() -> None:
    two = FakeEngine(replies=lambda prompt: f"{TAGGED}\n{OSLO}")
    req = {
        "model": "m",
        "max_tokens": 500,
        "messages": USER,
        "tools": ANTHROPIC_TOOLS,
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
    }
    with TestClient(create_app(settings(), lambda s: two)) as c:
        wait_ready(c)
        body = c.post("/v1/messages", json=req).json()
    assert [(b["type"], b.get("input")) for b in body["content"]] == [
        ("tool_use", {"city": "Paris"})
    ]


@pytest.mark.parametrize(
    ("fields", "server", "expected"),
    [
        ({"tools": TOOLS}, {}, 2048),  # the --tool-max-tokens default
        ({"tools": TOOLS, "max_tokens": 5000}, {}, 5000),  # the client's wins
        ({"tools": TOOLS, "max_completion_tokens": 7}, {}, 7),
        ({}, {}, -1),  # no tools: no cap
        ({"tools": TOOLS, "tool_choice": "none"}, {}, -1),
        ({"tools": TOOLS}, {"tool_max_tokens": -1}, -1),
        ({"tools": TOOLS}, {"tool_max_tokens": 300}, 300),
        ({"tools": TOOLS}, {"n_predict": 100}, 100),  # -n is smaller: the default
        ({"tools": TOOLS}, {"n_predict": 4000}, 2048),
        ({"tools": TOOLS, "max_tokens": -1}, {"n_predict": 100}, 100),  # -1: says nothing
        ({"tools": TOOLS, "max_tokens": 5000}, {"n_predict": 100}, 5000),  # a request's wins
        ({}, {"n_predict": 100}, 100),
    ],
)
def test_tool_requests_without_max_tokens_get_the_server_default(
    fields: dict, server: dict, expected: int
) -> None:
    fake = FakeEngine(replies=lambda prompt: "ok")
    with TestClient(create_app(settings(**server), lambda s: fake)) as c:
        wait_ready(c)
        r = c.post("/v1/chat/completions", json={"messages": USER, **fields})
        assert r.status_code == 200
    assert fake.calls[0].max_tokens == expected


def test_responses_tools_without_max_output_tokens_get_the_default() -> None:
    fake = FakeEngine(replies=lambda prompt: "ok")
    tools = [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]
    with TestClient(create_app(settings(), lambda s: fake)) as c:
        wait_ready(c)
        assert c.post("/v1/responses", json={"input": "Hi", "tools": tools}).status_code == 200
        body = {"input": "Hi", "tools": tools, "max_output_tokens": 4000}
        assert c.post("/v1/responses", json=body).status_code == 200
        assert c.post("/v1/responses", json={"input": "Hi"}).status_code == 200
    assert [call.max_tokens for call in fake.calls] == [2048, 4000, -1]
