"""Malformed chat requests get 400 with the OpenAI envelope naming the field."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from kvmem.server.app import create_app
from tests.fakes.app import USER, settings, wait_ready
from tests.fakes.engine import FakeEngine


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with TestClient(create_app(settings(), lambda s: FakeEngine(replies=lambda p: "ok"))) as c:
        wait_ready(c)
        yield c


MALFORMED: list[tuple[object, str | None]] = [
    ("{not json", None),
    ([1, 2], None),
    ({}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    (
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,!!"}}
                    ],
                }
            ]
        },
        "messages[0].content[0].image_url",
    ),
    ({"messages": USER, "temperature": "hot"}, "temperature"),
    ({"messages": USER, "temperature": -1}, "temperature"),
    ({"messages": USER, "top_p": 1.5}, "top_p"),
    ({"messages": USER, "max_tokens": -2}, "max_tokens"),
    ({"messages": USER, "max_tokens": "10"}, "max_tokens"),
    ({"messages": USER, "stream": "yes"}, "stream"),
    ({"messages": USER, "stop": 7}, "stop"),
    ({"messages": USER, "seed": 1.5}, "seed"),
    ({"messages": USER, "n": 9}, "n"),
    ({"messages": USER, "n": 2, "stream": True}, "n"),
    ({"messages": USER, "top_logprobs": 3}, "top_logprobs"),
    ({"messages": USER, "grammar": 'root ::= "a"', "json_schema": {}}, "grammar"),
    ({"messages": USER, "logit_bias": {"5": 3}}, "logit_bias"),
    (
        {"messages": USER, "continue_final_message": True, "add_generation_prompt": True},
        "continue_final_message",
    ),
    (
        {
            "messages": [
                *USER,
                {"role": "assistant", "content": "a"},
                {"role": "assistant", "content": "b"},
            ]
        },
        "messages",
    ),
    ({"messages": USER, "tools": {"type": "function"}}, "tools"),
    (
        {"messages": USER, "tools": [{"type": "function", "function": {"name": "bad name!"}}]},
        "tools.0.function.name",
    ),
    ({"messages": USER, "tool_choice": "required"}, "tool_choice"),
    (
        {
            "messages": USER,
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": {"type": "function", "function": {"name": "g"}},
        },
        "tool_choice",
    ),
    ({"messages": USER, "response_format": {"type": "xml"}}, "response_format.type"),
    ({"messages": USER, "response_format": {"type": "json_schema"}}, "response_format"),
    (
        {
            "messages": USER,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"schema": {"$ref": "http://x"}},
            },
        },
        "response_format",
    ),
    (
        {"messages": USER, "chat_template_kwargs": {"enable_thinking": "true"}},
        "chat_template_kwargs.enable_thinking",
    ),
    ({"messages": USER, "chat_template_kwargs": []}, "chat_template_kwargs"),
    ({"messages": USER, "reasoning_budget_tokens": -5}, "reasoning_budget_tokens"),
    ({"messages": USER, "reasoning_effort": 3}, "reasoning_effort"),
    ({"messages": USER, "stream_options": {"include_usage": True}}, "stream_options"),
    ({"messages": USER, "kvmem": {"conversation": "a"}}, "kvmem.conversation"),
    ({"messages": USER, "kvmem": {"conversation_id": "a b"}}, "kvmem.conversation_id"),
    ({"messages": USER, "kvmem": {"conversation_id": ""}}, "kvmem.conversation_id"),
    ({"messages": USER, "kvmem": {"conversation_id": 7}}, "kvmem.conversation_id"),
    ({"messages": USER, "kvmem": "c-1"}, "kvmem"),
]


@pytest.mark.parametrize(("body", "param"), MALFORMED)
def test_malformed_requests_get_400_envelopes(
    client: TestClient, body: object, param: str | None
) -> None:
    if isinstance(body, str):
        r = client.post(
            "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
        )
    else:
        r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert error["message"]
