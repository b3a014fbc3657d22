"""One validation of every JSON the client controls (issue 28), through the app on the
fake engine: tool-call `arguments` strings, schemas behind a `$ref`, and a forced tool
call with 900 optional properties are 400s with exact messages, never 500s."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from kvmem.server.app import create_app
from tests.fakes.app import USER, settings, wait_ready
from tests.fakes.engine import FakeEngine

DEEP = "[" * 100 + "]" * 100
ARGUMENTS = [
    ('{"a": ' + DEEP + "}", "is nested too deeply at 'a" + "[0]" * 63 + "' (at most 64 levels)"),
    ("[" * 5000 + "]" * 5000, "is nested too deeply (at most 64 levels)"),
    ('{"a": ' + "9" * 5000 + "}", "is not accepted: an integer has 5000 digits, more than 20"),
    ('{"a": "\\ud800"}', "holds a lone UTF-16 surrogate at 'a' (not valid Unicode text)"),
    ('{"a": 1e999}', "is not accepted: the number 1e999 is out of range"),
    (
        "{not json",
        "is not valid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
    ),
]


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with TestClient(create_app(settings(), lambda _: FakeEngine())) as c:
        wait_ready(c)
        yield c


def _chat_with_call(arguments: str) -> dict[str, object]:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    return {
        "messages": [
            *USER,
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        ],
        "max_tokens": 2,
    }


def _error(r) -> tuple[int, str, str | None, str]:  # type: ignore[no-untyped-def]
    body = r.json()
    return r.status_code, body["error"]["type"], body["error"]["param"], body["error"]["message"]


@pytest.mark.parametrize(("arguments", "words"), ARGUMENTS, ids=[a[:12] for a, _ in ARGUMENTS])
@pytest.mark.parametrize(
    "route", ["/v1/chat/completions", "/apply-template", "/v1/chat/completions/input_tokens"]
)
def test_chat_tool_call_arguments(
    client: TestClient, route: str, arguments: str, words: str
) -> None:
    param = "messages[1].tool_calls[0].function.arguments"
    r = client.post(route, json=_chat_with_call(arguments))
    assert _error(r) == (400, "invalid_request_error", param, f"{param} {words}")


@pytest.mark.parametrize(("arguments", "words"), ARGUMENTS, ids=[a[:12] for a, _ in ARGUMENTS])
def test_responses_function_call_arguments(client: TestClient, arguments: str, words: str) -> None:
    body = {
        "input": [
            {"role": "user", "content": "Hi"},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": arguments},
            {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        ],
        "max_output_tokens": 2,
    }
    r = client.post("/v1/responses", json=body)
    status, kind, param, message = _error(r)
    assert (status, kind) == (400, "invalid_request_error")
    assert message.endswith(words), message
    assert param is not None and param.endswith("arguments"), param


def test_anthropic_tool_use_input_too_deep(client: TestClient) -> None:
    value: object = 1
    for _ in range(80):
        value = [value]
    tool_use = {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": value}}
    result = {"type": "tool_result", "tool_use_id": "t1", "content": "ok"}
    body = {
        "model": "m",
        "max_tokens": 2,
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": [tool_use]},
            {"role": "user", "content": [result]},
        ],
    }
    r = client.post("/v1/messages", json=body)
    assert r.status_code == 400
    error = r.json()["error"]
    assert (r.json()["type"], error["type"]) == ("error", "invalid_request_error")
    path = "messages[1].content[0].input.a" + "[0]" * 60
    assert error["message"] == (
        f"the request body is nested too deeply at '{path[:200]}' (at most 64 levels)"
    )


BAD_TARGETS = [
    ({"type": "array", "minItems": "abc"}, "minItems", "'minItems' must be a non-negative integer"),
    (
        {"type": "string", "maxLength": "abc"},
        "maxLength",
        "'maxLength' must be a non-negative integer",
    ),
    ({"type": "object", "required": 5}, "required", "'required' must be an array of strings"),
    ({"anyOf": 5}, "anyOf", "'anyOf' must be a non-empty array"),
    ({"allOf": [5]}, "allOf", "'allOf' must hold schema objects"),
    ({"type": "array", "maxItems": -1}, "maxItems", "'maxItems' must be a non-negative integer"),
]


@pytest.mark.parametrize(
    ("target", "key", "words"), BAD_TARGETS, ids=[k for _, k, _ in BAD_TARGETS]
)
@pytest.mark.parametrize(
    ("route", "field"),
    [
        ("/v1/chat/completions", "response_format"),
        ("/v1/chat/completions", "json_schema"),
        ("/completion", "json_schema"),
        ("/v1/completions", "json_schema"),
    ],
)
def test_schema_behind_a_ref(
    client: TestClient, route: str, field: str, target: dict, key: str, words: str
) -> None:
    schema = {"$ref": "#/x", "x": target}
    body: dict[str, object] = (
        {"prompt": "x", "max_tokens": 2}
        if "chat" not in route
        else {"messages": USER, "max_tokens": 2}
    )
    if field == "response_format":
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": schema},
        }
    else:
        body["json_schema"] = schema
    r = client.post(route, json=body)
    assert _error(r) == (
        400,
        "invalid_request_error",
        field,
        f"invalid JSON schema at #/x/{key}: {words}",
    )


def test_required_tool_with_900_optional_properties(client: TestClient) -> None:
    params = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(900)}}
    tool = {"type": "function", "function": {"name": "f", "parameters": params}}
    body = {"messages": USER, "max_tokens": 2, "tools": [tool], "tool_choice": "required"}
    status, kind, param, message = _error(client.post("/v1/chat/completions", json=body))
    assert (status, kind, param) == (400, "invalid_request_error", "tools")
    assert message.startswith("invalid grammar: ") and message.endswith(", more than 262144")
