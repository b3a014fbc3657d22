"""Random bodies for /v1/responses and /v1/messages (the app on the fake engine) get a
200 or a 4xx in the API's own envelope, never a 5xx."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvmem.server.app import create_app
from tests.fakes.app import settings as app_settings
from tests.fakes.app import wait_ready
from tests.fakes.engine import FakeEngine

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**40), max_value=2**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
    | st.sampled_from(["user", "assistant", "text", "tool_use", "function_call", "message"])
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=10,
)
keys = st.sampled_from(["type", "role", "content", "text", "id", "name", "input", "call_id",
                        "arguments", "output", "tool_use_id", "summary", "thinking"])  # fmt: skip
items = st.dictionaries(keys, values, max_size=5)
responses_bodies = st.fixed_dictionaries(
    {"input": st.one_of(st.text(max_size=5), st.lists(items, max_size=3), values)},
    optional={
        "tools": values,
        "tool_choice": values,
        "text": values,
        "reasoning": values,
        "instructions": values,
        "previous_response_id": values,
    },
)
messages_bodies = st.fixed_dictionaries(
    {
        "model": st.just("m"),
        "max_tokens": st.integers(min_value=-1, max_value=3),
        "messages": st.one_of(
            st.lists(
                st.fixed_dictionaries(
                    {
                        "role": st.sampled_from(["user", "assistant"]),
                        "content": st.one_of(st.text(max_size=4), st.lists(items, max_size=3)),
                    }
                ),
                max_size=3,
            ),
            values,
        ),
    },
    optional={
        "system": values,
        "tools": values,
        "tool_choice": values,
        "thinking": values,
        "stop_sequences": values,
    },
)
CHECK = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                 suppress_health_check=list(HealthCheck))  # fmt: skip


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    fake = FakeEngine(replies=lambda prompt: "ok")
    with TestClient(create_app(app_settings(), lambda s: fake)) as c:
        wait_ready(c)
        yield c


def test_random_responses_bodies_never_get_a_5xx(client: TestClient) -> None:
    @CHECK
    @given(body=responses_bodies)
    def check(body: dict[str, Any]) -> None:
        r = client.post("/v1/responses", json={**body, "max_output_tokens": 2})
        assert r.status_code < 500, (r.text, body)
        if r.status_code >= 400:
            assert r.json()["error"]["type"] == "invalid_request_error", r.text

    check()


def test_random_messages_bodies_never_get_a_5xx(client: TestClient) -> None:
    @CHECK
    @given(body=messages_bodies)
    def check(body: dict[str, Any]) -> None:
        r = client.post("/v1/messages", json=body)
        assert r.status_code < 500, (r.text, body)
        if r.status_code >= 400:
            payload = r.json()
            assert payload["type"] == "error", r.text
            assert payload["error"]["type"] == "invalid_request_error", r.text

    check()
