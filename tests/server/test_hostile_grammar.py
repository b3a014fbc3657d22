"""Grammars that once aborted, wedged or swelled the server (issue 28), sent to a real
kvmem-server process under an address-space limit: each gets its exact 400, /health
answers at once afterwards, and a greedy request still gives the same answer."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.server.conftest import LiveServer
from tests.server.hostile_helpers import HI, fresh_answer, normal_answer, start_limited

pytestmark = pytest.mark.slow

ARGS = ("-c", "2048", "-t", "1", "--no-ui")
EMPTY_RANGE = (
    "invalid grammar: the character range z-a in rule 'root' is empty (its start is after its end)"
)
EMPTY_REPEAT = (
    "invalid grammar: rule 'root' repeats an item that can match the empty text "
    "(make the inner item non-optional)"
)
BIG_LITERAL = "invalid grammar: a literal in rule 'root' has 250000 characters, more than 65536"

GRAMMARS = [
    ("root ::= [z-a]", EMPTY_RANGE),
    ('root ::= "a" [z-a]', EMPTY_RANGE),
    ('root ::= ("a"?){0,1000} "b"', EMPTY_REPEAT),
    ('root ::= (("a"{0,20}){0,20}) "b"', EMPTY_REPEAT),
    ('root ::= "' + "x" * 250_000 + '"{1000}', BIG_LITERAL),
]
ROUTES = [
    ("/completion", {"prompt": "x", "n_predict": 4}),
    ("/completion", {"prompt": "x", "n_predict": 4, "stream": True}),
    ("/v1/completions", {"prompt": "x", "max_tokens": 4}),
    ("/v1/chat/completions", {"messages": HI, "max_tokens": 4}),
    ("/v1/chat/completions", {"messages": HI, "max_tokens": 4, "stream": True}),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = start_limited(ARGS, tmp_path_factory.mktemp("hostile-grammar"))
    yield live
    assert live.stop() == 0, live.log()[-3000:]


@pytest.fixture(scope="module")
def expected_normal(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A fresh server's greedy answer: the shared server must still give it after each case."""
    return fresh_answer(ARGS, tmp_path_factory.mktemp("fresh"))


def _healthy_and_same(server: LiveServer, expected: str) -> None:
    started = time.monotonic()
    assert httpx.get(server.base_url + "/health", timeout=5).status_code == 200
    assert time.monotonic() - started < 1.0
    assert normal_answer(server) == expected


@pytest.mark.parametrize(("grammar", "message"), GRAMMARS, ids=lambda v: str(v)[:30])
@pytest.mark.parametrize(("route", "body"), ROUTES, ids=lambda v: str(v)[:40])
def test_hostile_grammar_is_a_400(
    server: LiveServer, expected_normal: str, grammar: str, message: str, route: str, body: dict
) -> None:
    started = time.monotonic()
    r = httpx.post(server.base_url + route, json={**body, "grammar": grammar}, timeout=60)
    assert time.monotonic() - started < 10
    assert r.status_code == 400, r.text[:500]
    error = r.json()["error"]
    assert (error["message"], error["type"], error["param"]) == (
        message,
        "invalid_request_error",
        "grammar",
    )
    _healthy_and_same(server, expected_normal)


@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("/completion", {"prompt": "Answer:", "n_predict": 8, "grammar": 'root ::= "yes"'}),
        ("/v1/completions", {"prompt": "Answer:", "max_tokens": 8, "grammar": 'root ::= "yes"'}),
        ("/completion", {"prompt": "Answer:", "n_predict": 12, "json_schema": {"type": "boolean"}}),
        (
            "/v1/completions",
            {
                "prompt": "Answer:",
                "max_tokens": 12,
                "json_schema": {"type": "boolean"},
                "stream": True,
            },
        ),
    ],
)
def test_grammar_with_ignore_eos_stops(
    server: LiveServer, expected_normal: str, route: str, body: dict
) -> None:
    """ignore_eos bans EOS; a finished grammar then allows no token: the answer ends with
    `stop` (llama.cpp aborted the process here before)."""
    r = httpx.post(
        server.base_url + route, json={**body, "ignore_eos": True, "temperature": 0}, timeout=60
    )
    assert r.status_code == 200, r.text[:500]
    if body.get("stream"):
        events = [
            json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")
        ]
        text = "".join(e["choices"][0]["text"] for e in events)
        finish = events[-1]["choices"][0]["finish_reason"]
    elif route == "/completion":
        text, finish = r.json()["content"], r.json()["stop_type"]
    else:
        text, finish = r.json()["choices"][0]["text"], r.json()["choices"][0]["finish_reason"]
    if "grammar" in body:
        assert text == "yes"
    else:
        assert text in ("true", "false")
    assert finish in ("stop", "eos")
    _healthy_and_same(server, expected_normal)


def _nested_any_of(levels: int) -> dict[str, object]:
    defs: dict[str, object] = {}
    for k in range(levels):
        inner = {"$ref": f"#/$defs/l{k + 1}"} if k + 1 < levels else {"type": "integer"}
        alternatives = [{"type": "array", "items": inner, "maxItems": i + 1} for i in range(8)]
        defs[f"l{k}"] = {"anyOf": alternatives}
    return {"$defs": defs, "$ref": "#/$defs/l0"}


AMBIGUOUS = (
    "invalid grammar: more than 128 ways to parse the same text are alive at once "
    "(after '[['); make the alternatives start differently"
)


@pytest.mark.parametrize(
    ("route", "body", "param"),
    [
        (
            "/v1/chat/completions",
            {
                "messages": HI,
                "max_tokens": 4,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": _nested_any_of(5)},
                },
            },
            "response_format",
        ),
        ("/completion", {"prompt": "x", "json_schema": _nested_any_of(5)}, "json_schema"),
        ("/v1/completions", {"prompt": "x", "json_schema": _nested_any_of(5)}, "json_schema"),
    ],
)
def test_nested_any_of_schema_is_a_400(
    server: LiveServer, expected_normal: str, route: str, body: dict, param: str
) -> None:
    r = httpx.post(server.base_url + route, json=body, timeout=60)
    assert r.status_code == 400, r.text[:500]
    error = r.json()["error"]
    assert (error["message"], error["type"]) == (AMBIGUOUS, "invalid_request_error")
    assert error["param"] == param
    _healthy_and_same(server, expected_normal)
