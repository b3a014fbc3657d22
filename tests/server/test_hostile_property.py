"""Property test: random JSON bodies and schemas for /v1/chat/completions never get a 5xx.

2,000 generated cases (derandomized, so CI runs the same ones) against a real server
process under an address-space limit. Generation is capped at one token per request.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.server.conftest import LiveServer
from tests.server.hostile_helpers import start_limited

pytestmark = pytest.mark.slow

CASES = 2000
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
    live = start_limited(ARGS, tmp_path_factory.mktemp("property"))
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

        @settings(
            max_examples=CASES,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
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
