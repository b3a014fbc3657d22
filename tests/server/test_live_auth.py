"""The auth matrix on real servers: open without keys; with keys (CLI, file, environment)
401 without a key, 200 with Bearer or X-Api-Key; health stays public; keys never shown."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.server.conftest import AUTH_KEY_ENV, AUTH_KEY_FILE, LiveServer

pytestmark = pytest.mark.slow

HELLO = [{"role": "user", "content": "Hi"}]


def test_no_keys_means_open(main_server: LiveServer) -> None:
    with main_server.http() as http:
        assert http.get("/v1/models").status_code == 200
        assert http.get("/props").status_code == 200


@pytest.mark.parametrize("path", ["/v1/models", "/props", "/metrics"])
def test_protected_routes_need_a_key(auth_server: LiveServer, path: str) -> None:
    with auth_server.http() as http:
        r = http.get(path)
        assert r.status_code == 401
        assert r.json()["error"]["type"] == "authentication_error"
        assert http.get(path, headers={"Authorization": "Bearer sk-wrong"}).status_code == 401
        assert http.get(path, headers={"Authorization": "Bearer sk-cli-2"}).status_code == 200
        assert http.get(path, headers={"X-Api-Key": AUTH_KEY_FILE}).status_code == 200


def test_openai_client_with_cli_env_and_file_keys(auth_server: LiveServer) -> None:
    with pytest.raises(openai.AuthenticationError) as info:
        auth_server.client(api_key="sk-wrong").chat.completions.create(
            model="m", messages=HELLO, max_tokens=1
        )
    assert info.value.status_code == 401
    for key in ("sk-cli-1", AUTH_KEY_ENV, AUTH_KEY_FILE):
        response = auth_server.client(api_key=key).chat.completions.create(
            model="m", messages=HELLO, max_tokens=2, temperature=0
        )
        assert response.choices[0].message.role == "assistant"


def test_x_api_key_on_chat_and_public_health(auth_server: LiveServer) -> None:
    with auth_server.http() as http:
        r = http.post(
            "/v1/chat/completions",
            json={"messages": HELLO, "max_tokens": 1},
            headers={"X-Api-Key": "sk-cli-1"},
        )
        assert r.status_code == 200
        assert http.post("/v1/chat/completions", json={"messages": HELLO}).status_code == 401
        assert http.get("/health").status_code == 200
        assert http.get("/v1/health").status_code == 200
        preflight = http.options(
            "/v1/chat/completions",
            headers={
                "Origin": "http://localhost:3000",
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization",
            },
        )
        assert preflight.status_code == 200


def test_keys_never_appear_in_props_or_logs(auth_server: LiveServer) -> None:
    props = httpx.get(auth_server.base_url + "/props", headers={"X-Api-Key": "sk-cli-1"}).text
    log = auth_server.log()
    for key in ("sk-cli-1", "sk-cli-2", AUTH_KEY_ENV, AUTH_KEY_FILE):
        assert key not in props
        assert key not in log
    assert json.loads(props)["auth"] == {"enabled": True}
