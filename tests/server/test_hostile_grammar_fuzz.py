"""Grammar fuzz and the grammar deadline (issue 28), against one real kvmem-server process
under an address-space limit with `--grammar-deadline 3`.

- 520 generated grammars and JSON schemas (nested and counted repetitions, inverted and
  negated ranges, alternations, recursion, `$ref` chains, enums of up to 3,000 values
  with a long shared prefix): each gets a 400 `invalid_request_error` or finishes within
  its deadline, and the lane is free afterwards (/slots says so, /health answers within
  1 s). The cases are derandomized, so CI sends the same ones.
- A grammar-constrained generation that runs past the deadline ends with a 400
  `grammar_deadline_exceeded` (a terminal error event when streamed; Anthropic's envelope
  on /v1/messages), and the next request is served at once.
- Afterwards the server's greedy answer equals a fresh server's.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.server.conftest import LiveServer
from tests.server.hostile_helpers import (
    HI,
    fresh_answer,
    live_settings,
    normal_answer,
    start_limited,
)

pytestmark = pytest.mark.slow

DEADLINE_S = 3
ARGS = ("-c", "2048", "-t", "1", "--no-ui", "--grammar-deadline", str(DEADLINE_S))
CASES = 520
PARAMS = ("grammar", "json_schema", "response_format", None)  # None: the deadline's error
# a grammar's checks run before its generation: a generous bound of the whole request
REQUEST_BOUND_S = DEADLINE_S + 15

chars = st.sampled_from(["a", "b", "z", "0", "é", " ", '\\"', "\\n", "\\\\"])
literal = st.lists(chars, min_size=0, max_size=6).map(lambda cs: '"' + "".join(cs) + '"')
char_class = st.tuples(
    st.sampled_from(["", "^"]), st.sampled_from("az09"), st.sampled_from("az09")
).map(lambda t: f"[{t[0]}{t[1]}-{t[2]}]")
atoms = literal | char_class | st.sampled_from([".", "r1", "root", "[ab]", '"x"'])
counts = st.tuples(st.integers(0, 1200), st.integers(0, 1200) | st.none()).map(
    lambda t: f"{{{t[0]}}}" if t[1] is None else f"{{{min(t)},{max(t[0], t[1])}}}"
)
suffixes = st.sampled_from(["", "", "*", "+", "?"]) | counts


def _compose(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    group = st.tuples(inner, suffixes).map(lambda t: f"({t[0]}){t[1]}")
    sequence = st.lists(inner, min_size=2, max_size=3).map(" ".join)
    choice = st.lists(inner, min_size=2, max_size=4).map(" | ".join)
    return group | sequence | choice


expressions = st.recursive(st.tuples(atoms, suffixes).map("".join), _compose, max_leaves=8)
grammars = st.tuples(expressions, expressions).map(lambda t: f"root ::= {t[0]}\nr1 ::= {t[1]}\n")

leaf_schemas = st.sampled_from(
    [
        {"type": "string"},
        {"type": "integer"},
        {"type": "boolean"},
        {"type": "string", "maxLength": 3},
        {"type": "number", "minimum": 0, "maximum": 1},
        {"type": "array", "minItems": "abc"},
        {"type": "string", "minLength": 5, "maxLength": 2},
    ]
)
large_enums = st.tuples(st.integers(1, 3000), st.integers(0, 60)).map(
    lambda t: {"enum": ["p" * t[1] + str(i) for i in range(t[0])]}
)


def _nest_schema(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    counts_ = st.integers(0, 1100)
    return (
        st.lists(inner, min_size=1, max_size=8).map(lambda xs: {"anyOf": xs})
        | st.tuples(inner, counts_, counts_).map(
            lambda t: {"type": "array", "items": t[0], "minItems": t[1], "maxItems": t[2]}
        )
        | st.dictionaries(st.sampled_from("abcd"), inner, min_size=1, max_size=3).map(
            lambda p: {"type": "object", "properties": p, "required": sorted(p)}
        )
        | inner.map(lambda s: {"$ref": "#/$defs/d", "$defs": {"d": s}})
    )


schemas = st.recursive(leaf_schemas | large_enums, _nest_schema, max_leaves=10)
cases = st.one_of(
    grammars.map(lambda g: ("/completion", {"prompt": "x", "n_predict": 8, "grammar": g})),
    schemas.map(lambda s: ("/completion", {"prompt": "x", "n_predict": 8, "json_schema": s})),
    schemas.map(
        lambda s: (
            "/v1/chat/completions",
            {
                "messages": HI,
                "max_tokens": 8,
                "response_format": {"type": "json_schema", "json_schema": {"schema": s}},
            },
        )
    ),
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = start_limited(ARGS, tmp_path_factory.mktemp("grammar-fuzz"))
    yield live
    assert live.stop() == 0, live.log()[-3000:]


def _lane_free(http: httpx.Client) -> None:
    started = time.monotonic()
    assert http.get("/health", timeout=5).status_code == 200
    assert time.monotonic() - started < 1.0
    slots = http.get("/slots", timeout=5).json()
    assert [slot["is_processing"] for slot in slots] == [False]


def test_generated_grammars_and_schemas_get_a_400_or_finish_in_time(server: LiveServer) -> None:
    seen: dict[str, int] = {}
    with httpx.Client(base_url=server.base_url, timeout=120) as http:

        @live_settings(CASES)
        @given(case=cases)
        def check(case: tuple[str, dict[str, Any]]) -> None:
            route, body = case
            started = time.monotonic()
            r = http.post(route, json={**body, "temperature": 0})
            took = time.monotonic() - started
            assert took < REQUEST_BOUND_S, (took, json.dumps(body)[:300])
            if r.status_code == 200:
                kind = "done"
            else:
                assert r.status_code == 400, (r.status_code, r.text[:300], json.dumps(body)[:300])
                error = r.json()["error"]
                assert error["type"] == "invalid_request_error", error
                kind = error["code"]
                assert error["message"] and error["param"] in PARAMS, error
            seen[kind] = seen.get(kind, 0) + 1
            _lane_free(http)

        check()
    assert sum(seen.values()) == CASES
    assert seen.get("done", 0) > 50 and seen.get("invalid_request", 0) > 50, seen
    assert "Traceback" not in server.log()


LONG = "root ::= [a-z ]+"  # with ignore_eos: no end before max_tokens (1,500: minutes)


@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("/completion", {"prompt": "Story:", "n_predict": 1500, "grammar": LONG}),
        ("/completion", {"prompt": "Story:", "n_predict": 1500, "grammar": LONG, "stream": True}),
        ("/v1/completions", {"prompt": "Story:", "max_tokens": 1500, "grammar": LONG}),
        ("/v1/chat/completions", {"messages": HI, "max_tokens": 1500, "grammar": LONG}),
        (
            "/v1/chat/completions",
            {"messages": HI, "max_tokens": 1500, "grammar": LONG, "stream": True},
        ),
    ],
)
def test_a_generation_past_the_deadline_ends_with_a_400_and_frees_the_lane(
    server: LiveServer, route: str, body: dict[str, Any]
) -> None:
    started = time.monotonic()
    r = httpx.post(server.base_url + route, json={**body, "ignore_eos": True}, timeout=120)
    took = time.monotonic() - started
    assert DEADLINE_S < took < DEADLINE_S + 10, took
    if body.get("stream"):
        assert r.status_code == 200
        events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
        if route != "/completion":  # llama-server's native stream has no [DONE]
            assert events.pop() == "[DONE]"
        error = json.loads(events[-1])["error"]
    else:
        assert r.status_code == 400, r.text[:500]
        error = r.json()["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "grammar_deadline_exceeded")
    assert error["message"].startswith(
        f"the grammar-constrained generation ran longer than {DEADLINE_S} s (--grammar-deadline)"
    )
    with httpx.Client(base_url=server.base_url) as http:
        _lane_free(http)


def test_anthropic_forced_tool_past_the_deadline_uses_its_envelope(server: LiveServer) -> None:
    tool = {
        "name": "f",
        "input_schema": {
            "type": "object",
            "properties": {"a": {"type": "array", "items": {"type": "string"}, "minItems": 300}},
            "required": ["a"],
        },
    }
    body = {
        "model": "x",
        "max_tokens": 2000,
        "messages": HI,
        "tools": [tool],
        "tool_choice": {"type": "any"},
    }
    r = httpx.post(server.base_url + "/v1/messages", json=body, timeout=120)
    assert r.status_code == 400, r.text[:500]
    assert r.json()["type"] == "error"
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert "(--grammar-deadline)" in error["message"]


def test_the_answer_afterwards_equals_a_fresh_servers(server: LiveServer, tmp_path: Path) -> None:
    assert normal_answer(server) == fresh_answer(ARGS, tmp_path)
