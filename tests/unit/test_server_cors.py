"""CORS, three cases (server/cors.py, issue 30): `--cors-origins` rules when given; a server
with an API key and no `--cors-origins` answers as llama-server (every origin reflected,
`Access-Control-Allow-Headers: *`); a server without either allows no origin."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from httpx import Response

from kvmem.cli.api_keys import ApiKeys
from kvmem.cli.limit_flags import ServerLimits
from kvmem.server.app import create_app
from kvmem.server.cors import CorsPolicy
from tests.fakes.app import USER, settings, wait_ready
from tests.fakes.engine import FakeEngine

KEY = "sk-cors"
ASK = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "Authorization"}
LLAMA_SERVER_PREFLIGHT = {  # what llama.cpp's test_security.py::test_cors_options expects
    "access-control-allow-credentials": "true",
    "access-control-allow-methods": "GET, POST, DELETE, OPTIONS",
    "access-control-allow-headers": "*",
}


def _exchange(keyed: bool, limits: ServerLimits, origin: str) -> tuple[Response, Response]:
    """The answers to a preflight from `origin` and to the POST it asks for (with the key)."""
    s = settings(api_keys=ApiKeys((KEY,) if keyed else ()), limits=limits)
    engine = FakeEngine(replies=["Hello"])
    with TestClient(create_app(s, lambda _: engine)) as c:
        wait_ready(c)
        preflight = c.options("/completions", headers={"Origin": origin, **ASK})
        post = c.post(
            "/v1/chat/completions",
            json={"messages": USER, "max_tokens": 2},
            headers={"Origin": origin, "Authorization": f"Bearer {KEY}"},
        )
    return preflight, post


@pytest.mark.parametrize("origin", ["localhost", "web.mydomain.fr", "http://evil.example"])
def test_a_keyed_server_without_cors_origins_answers_as_llama_server(origin: str) -> None:
    preflight, post = _exchange(True, ServerLimits(), origin)
    assert (preflight.status_code, preflight.content) == (200, b"")
    assert preflight.headers["access-control-allow-origin"] == origin
    for name, value in LLAMA_SERVER_PREFLIGHT.items():
        assert preflight.headers[name] == value
    assert post.status_code == 200
    assert post.headers["access-control-allow-origin"] == origin
    assert post.headers["access-control-allow-credentials"] == "true"


def test_a_keyed_server_still_refuses_a_request_without_the_key() -> None:
    s = settings(api_keys=ApiKeys((KEY,)))
    engine = FakeEngine(replies=["Hello"])
    with TestClient(create_app(s, lambda _: engine)) as c:
        wait_ready(c)
        r = c.post(
            "/v1/chat/completions",
            json={"messages": USER},
            headers={"Origin": "http://evil.example"},
        )
        bare = c.options("/completions", headers=ASK)  # no Origin: nothing to reflect
    assert r.status_code == 401
    assert r.json()["error"]["type"] == "authentication_error"
    assert r.headers["access-control-allow-origin"] == "http://evil.example"
    assert bare.status_code == 200 and "access-control-allow-origin" not in bare.headers


def test_a_server_without_key_or_cors_origins_allows_no_origin() -> None:
    preflight, post = _exchange(False, ServerLimits(), "http://evil.example")
    assert preflight.status_code == 200
    assert "access-control-allow-origin" not in preflight.headers
    assert preflight.headers["access-control-allow-headers"] == "Authorization"
    assert post.status_code == 200
    assert "access-control-allow-origin" not in post.headers


@pytest.mark.parametrize("keyed", [True, False])
def test_cors_origins_rule_with_or_without_a_key(keyed: bool) -> None:
    limits = ServerLimits(cors_origins=("http://a.example",))
    preflight, post = _exchange(keyed, limits, "http://a.example")
    assert preflight.headers["access-control-allow-origin"] == "http://a.example"
    assert preflight.headers["access-control-allow-headers"] == "Authorization"  # the asked ones
    assert post.headers["access-control-allow-origin"] == "http://a.example"
    other, other_post = _exchange(keyed, limits, "http://b.example")
    assert other.status_code == 200
    assert "access-control-allow-origin" not in other.headers
    assert "access-control-allow-origin" not in other_post.headers


def test_the_policy_of_each_case() -> None:
    listed = ServerLimits(cors_origins=("http://a.example",), cors_headers=("X-A",))
    assert CorsPolicy.of(ServerLimits(), keyed=True) == CorsPolicy(
        ("*",), ("GET", "POST", "DELETE", "OPTIONS"), ("*",), False, True
    )
    assert CorsPolicy.of(ServerLimits(), keyed=False).origins == ()
    assert CorsPolicy.of(ServerLimits(), keyed=False).echo_asked is True
    assert CorsPolicy.of(listed, keyed=True) == CorsPolicy(
        ("http://a.example",), ("GET", "POST", "DELETE", "OPTIONS"), ("X-A",), True, True
    )
    assert CorsPolicy.of(ServerLimits(), keyed=True).allows("") is False
