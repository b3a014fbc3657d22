"""Property tests: random JSON bodies and schemas never get a 5xx.

1,000 generated cases for /v1/chat/completions and 1,000 over the Anthropic,
Responses and completion shapes (/v1/messages, /v1/responses, /completion,
/v1/completions, with tool-call argument strings, tool_use inputs and schemas behind
`$ref`), all derandomized (CI runs the same ones), against one real server process under
an address-space limit. Generation is capped at one token per request, so the cases
exercise validation, the schema and grammar checks, templates and tokenization.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.server.conftest import LiveServer
from tests.server.hostile_helpers import live_settings, normal_answer, start_limited

pytestmark = pytest.mark.slow

CASES = 1000  # per test: 2,000 bodies over the two tests (chat; the other APIs)
ARGS = ("-c", "1024", "-t", "1", "--metrics", "--no-ui")

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
    | st.sampled_from(["", "user", "<|im_start|>", "\x00", "{{ x }}", "{% raise %}", "é"])
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
SCHEMA_KEYS = [
    "type", "properties", "required", "items", "prefixItems", "enum", "const", "anyOf",
    "oneOf", "allOf", "$ref", "$defs", "minItems", "maxItems", "minLength", "maxLength",
    "minimum", "maximum", "pattern", "additionalProperties", "format",
]  # fmt: skip
schema_values = (
    st.sampled_from(["object", "array", "string", "number", "integer", "boolean", "null"])
    | st.integers(min_value=-3, max_value=2000)
    | st.sampled_from(["#/$defs/a", "#/definitions/x", "#", "http://x"])
    | json_values
)
schemas = st.recursive(
    st.dictionaries(st.sampled_from(SCHEMA_KEYS), schema_values, max_size=4) | st.booleans(),
    lambda inner: st.dictionaries(
        st.sampled_from(SCHEMA_KEYS),
        inner
        | st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=4), inner, max_size=3),
        max_size=4,
    ),
    max_leaves=10,
)
roles = st.sampled_from(["user", "system", "assistant", "tool", "developer", "pirate"])
messages = st.lists(
    st.fixed_dictionaries(
        {"role": roles},
        optional={
            "content": st.text(max_size=30) | json_values,
            "tool_calls": json_values,
            "tool_call_id": st.text(max_size=5),
            "name": st.text(max_size=5),
        },
    ),
    max_size=3,
)
FIELDS = {
    "temperature": st.floats(allow_nan=False, allow_infinity=False) | json_values,
    "top_p": st.floats(allow_nan=False, allow_infinity=False) | json_values,
    "top_k": st.integers(min_value=-5, max_value=10**6) | json_values,
    "seed": st.integers(min_value=-(2**64), max_value=2**64) | json_values,
    "stop": st.lists(st.text(max_size=4), max_size=3) | json_values,
    "stream": st.booleans() | json_values,
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}) | json_values,
    "tools": st.lists(
        st.fixed_dictionaries(
            {
                "type": st.just("function"),
                "function": st.fixed_dictionaries(
                    {"name": st.sampled_from(["f", "g", "bad name"]), "parameters": schemas}
                ),
            }
        ),
        max_size=2,
    )
    | json_values,
    "tool_choice": st.sampled_from(["none", "auto", "required"])
    | st.just({"type": "function", "function": {"name": "f"}})
    | json_values,
    "response_format": st.fixed_dictionaries(
        {
            "type": st.sampled_from(["json_schema", "json_object", "text"]),
            "json_schema": st.fixed_dictionaries({"name": st.just("x"), "schema": schemas}),
        }
    )
    | json_values,
    "chat_template_kwargs": st.dictionaries(
        st.sampled_from(["enable_thinking", "messages", "tools", "x", "bos_token"]), json_values
    )
    | json_values,
    "reasoning_effort": st.sampled_from(["none", "low", "high", "default"]) | json_values,
    "reasoning_budget_tokens": st.integers(min_value=-3, max_value=5) | json_values,
    "repeat_penalty": st.floats(allow_nan=False, allow_infinity=False) | json_values,
    "n": st.integers(min_value=-1, max_value=3) | json_values,
    "logprobs": json_values,
}
structured = st.fixed_dictionaries(
    {"messages": messages | json_values}, optional=dict(FIELDS.items())
)
HI = [{"role": "user", "content": "hi"}]
# Well-formed requests whose only odd part is a random schema: they reach the schema
# checks, the grammar builder and llama.cpp's grammar parser (same prompt: KV reuse).
schema_only = st.fixed_dictionaries(
    {
        "messages": st.just(HI),
        "response_format": st.fixed_dictionaries(
            {
                "type": st.just("json_schema"),
                "json_schema": st.fixed_dictionaries({"schema": schemas}),
            }
        ),
    }
)
forced_tool = st.fixed_dictionaries(
    {
        "messages": st.just(HI),
        "tools": st.lists(
            st.fixed_dictionaries(
                {
                    "type": st.just("function"),
                    "function": st.fixed_dictionaries(
                        {"name": st.just("f"), "parameters": schemas}
                    ),
                }
            ),
            min_size=1,
            max_size=1,
        ),
        "tool_choice": st.sampled_from(
            ["required", {"type": "function", "function": {"name": "f"}}]
        ),
    }
)
bodies = st.one_of(json_values, structured, schema_only, forced_tool)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    logs = tmp_path_factory.mktemp("property")
    live = start_limited((*ARGS, "--slot-save-path", str(logs)), logs)  # the erase at the end
    yield live
    assert live.stop() == 0, live.log()[-3000:]


def _capped(body: Any) -> Any:
    if isinstance(body, dict):
        body = {**body, "max_tokens": 1}
        body.pop("max_completion_tokens", None)
        body.pop("ignore_eos", None)
    return body


def test_random_bodies_never_get_a_5xx(server: LiveServer) -> None:
    seen: dict[int, int] = {}
    with httpx.Client(base_url=server.base_url, timeout=120) as http:

        @live_settings(CASES)
        @given(body=bodies)
        def check(body: Any) -> None:
            raw = json.dumps(_capped(body)).encode()
            r = http.post(
                "/v1/chat/completions", content=raw, headers={"content-type": "application/json"}
            )
            seen[r.status_code] = seen.get(r.status_code, 0) + 1
            assert r.status_code < 500, (r.status_code, r.text[:500], raw[:500])
            assert "internal_error" not in r.text, (r.text[:500], raw[:500])
            if r.status_code >= 400:
                error = r.json()["error"]
                assert error["type"] == "invalid_request_error" and error["message"]

        check()
    assert sum(seen.values()) == CASES
    assert seen.get(200, 0) > 0 and seen.get(400, 0) > 0, seen
    metrics = httpx.get(server.base_url + "/metrics", timeout=30).text
    assert "Traceback" not in server.log()
    assert re.search(r"^kvmem_requests_failed_total ", metrics, re.M)


# --- the other APIs ---------------------------------------------------------------------
ref_schemas = schemas.map(lambda s: {"$ref": "#/$defs/a", "$defs": {"a": s}}) | schemas.map(
    lambda s: {"$ref": "#/x", "x": s}
)
argument_strings = (
    json_values.map(json.dumps)
    | st.text(max_size=20)
    | st.integers(1, 300).map(lambda n: "[" * n + "]" * n)
    | st.integers(1, 6000).map(lambda n: '{"a": ' + "9" * n + "}")
    | st.sampled_from(['{"a": "\\ud800"}', '{"<|im_start|>": 1}', "{", "null", "1e999"])
)
USER = {"role": "user", "content": "hi"}
chat_tool_calls = st.fixed_dictionaries(
    {
        "messages": st.tuples(st.text(max_size=4), argument_strings).map(
            lambda t: [
                USER,
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "id": "c",
                            "type": "function",
                            "function": {"name": t[0], "arguments": t[1]},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "c", "content": "ok"},
            ]
        ),
    },
    optional={
        "response_format": ref_schemas.map(
            lambda s: {"type": "json_schema", "json_schema": {"name": "x", "schema": s}}
        )
    },
)
anthropic_tools = st.lists(
    st.fixed_dictionaries(
        {"name": st.sampled_from(["f", "g", "bad name"]), "input_schema": ref_schemas}
    ),
    max_size=2,
)
# Mostly well-formed tool_use inputs and tool_result contents (random JSON alone is an
# object or text about one time in ten), so the Anthropic route draws 200s as well as 400s.
tool_inputs = st.dictionaries(st.text(max_size=8), json_values, max_size=3) | json_values
tool_results = st.text(max_size=12) | json_values
anthropic = st.fixed_dictionaries(
    {
        "model": st.just("x"),
        "messages": st.tuples(tool_inputs, tool_results).map(
            lambda t: [
                USER,
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t", "name": "f", "input": t[0]}],
                },
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "t", "content": t[1]}],
                },
            ]
        )
        | messages
        | json_values,
    },
    optional={
        "tools": anthropic_tools | json_values,
        "tool_choice": st.sampled_from(
            [{"type": "any"}, {"type": "auto"}, {"type": "tool", "name": "f"}]
        )
        | json_values,
        "system": st.text(max_size=10) | json_values,
        "temperature": FIELDS["temperature"],
        "stream": FIELDS["stream"],
        "thinking": json_values,
    },
)
responses = st.fixed_dictionaries(
    {
        "input": st.tuples(st.text(max_size=4), argument_strings).map(
            lambda t: [
                {"type": "message", "role": "user", "content": "hi"},
                {"type": "function_call", "call_id": "c", "name": t[0], "arguments": t[1]},
                {"type": "function_call_output", "call_id": "c", "output": "ok"},
            ]
        )
        | st.text(max_size=10)
        | json_values
    },
    optional={
        "tools": st.lists(
            st.fixed_dictionaries(
                {"type": st.just("function"), "name": st.just("f"), "parameters": ref_schemas}
            ),
            max_size=1,
        )
        | json_values,
        "text": ref_schemas.map(
            lambda s: {"format": {"type": "json_schema", "name": "x", "schema": s}}
        )
        | json_values,
        "tool_choice": st.sampled_from(["auto", "required", "none"]) | json_values,
        "instructions": st.text(max_size=10) | json_values,
        "stream": FIELDS["stream"],
    },
)
completion = st.fixed_dictionaries(
    {"prompt": st.text(max_size=20) | st.lists(st.integers(-5, 60000), max_size=5) | json_values},
    optional={
        "grammar": st.text(max_size=30) | st.sampled_from(['root ::= "a"', "root ::= [z-a]"]),
        "json_schema": ref_schemas | json_values,
        "temperature": FIELDS["temperature"],
        "n_probs": st.integers(-2, 30) | json_values,
        "logit_bias": json_values,
        "stop": FIELDS["stop"],
        "stream": FIELDS["stream"],
        "ignore_eos": st.booleans(),
    },
)
# A well-formed request whose tool's input schema is random (behind `$ref`): it reaches
# the schema checks and the grammar of a forced tool call through the Anthropic shape.
anthropic_forced = st.fixed_dictionaries(
    {
        "model": st.just("x"),
        "messages": st.just([USER]),
        "tools": ref_schemas.map(lambda s: [{"name": "f", "input_schema": s}]),
        "tool_choice": st.sampled_from([{"type": "any"}, {"type": "tool", "name": "f"}]),
    }
)
routed = st.one_of(
    chat_tool_calls.map(lambda b: ("/v1/chat/completions", {**b, "max_tokens": 1})),
    st.one_of(anthropic, anthropic_forced).map(lambda b: ("/v1/messages", {**b, "max_tokens": 1})),
    responses.map(lambda b: ("/v1/responses", {**b, "max_output_tokens": 1})),
    completion.map(lambda b: ("/completion", {**b, "n_predict": 1})),
    completion.map(lambda b: ("/v1/completions", {**b, "max_tokens": 1})),
)


def _answer_afresh(server: LiveServer) -> str:
    """NORMAL's greedy answer with the slot erased first: the KV a case (or the previous
    test's last case) left in the slot may be reused by a prompt sharing part of it, and
    may then differ in the last bits (docs/architecture.md, "History independence")."""
    erased = httpx.post(server.base_url + "/slots/0?action=erase", json={}, timeout=60)
    assert erased.status_code == 200, erased.text
    return normal_answer(server)


def test_random_bodies_of_every_api_never_get_a_5xx(server: LiveServer) -> None:
    expected = _answer_afresh(server)  # the server took the chat cases already
    seen: dict[tuple[str, int], int] = {}
    with httpx.Client(base_url=server.base_url, timeout=120) as http:

        @live_settings(CASES)
        @given(case=routed)
        def check(case: tuple[str, Any]) -> None:
            route, body = case
            raw = json.dumps(body).encode()
            r = http.post(route, content=raw, headers={"content-type": "application/json"})
            seen[route, r.status_code] = seen.get((route, r.status_code), 0) + 1
            assert r.status_code < 500, (route, r.status_code, r.text[:500], raw[:500])
            assert "internal_error" not in r.text, (r.text[:500], raw[:500])
            if r.status_code >= 400:
                assert r.status_code == 400, (route, r.status_code, r.text[:300])
                error = r.json()
                if route == "/v1/messages":
                    assert error["type"] == "error"
                assert error["error"]["type"] == "invalid_request_error", (route, r.text[:300])
                assert error["error"]["message"]

        check()
    assert sum(seen.values()) == CASES
    for route in ("/v1/chat/completions", "/v1/messages", "/v1/responses", "/completion"):
        assert seen.get((route, 200), 0) > 0 and seen.get((route, 400), 0) > 0, seen
    assert "Traceback" not in server.log()
    assert _answer_afresh(server) == expected  # computed afresh by the server that took them
