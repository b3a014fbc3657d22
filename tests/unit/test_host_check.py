"""The Host check (server/host_check.py): what a server without an API key answers to."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from kvmem.cli.api_keys import ApiKeys
from kvmem.cli.limit_flags import ServerLimits
from kvmem.cli.server_config import load_server_settings
from kvmem.errors import ConfigError
from kvmem.server.host_check import HostCheck, allowed_names, host_name, served_names
from tests.fakes.app import settings


@pytest.mark.parametrize(
    ("header", "name"),
    [
        ("localhost:8080", "localhost"),
        ("LocalHost", "localhost"),
        ("127.0.0.1:8080", "127.0.0.1"),
        ("[::1]:8080", "::1"),
        ("[::1]", "::1"),
        ("::1", "::1"),
        ("evil.example.:80", "evil.example"),
    ],
)
def test_host_name(header: str, name: str) -> None:
    assert host_name(header) == name


def test_served_names_follow_the_bind_address_the_flag_and_the_api_key() -> None:
    assert served_names(settings()) == frozenset({"localhost", "127.0.0.1"})
    both = settings(host="0.0.0.0,box.lan", limits=ServerLimits(allowed_hosts=("api.lan",)))
    assert served_names(both) == frozenset({"localhost", "0.0.0.0", "box.lan", "api.lan"})
    assert served_names(settings(limits=ServerLimits(allowed_hosts=("*",)))) is None
    assert served_names(settings(api_keys=ApiKeys(("k",)))) is None


def _client(names: frozenset[str] | None, host: str) -> TestClient:
    inner = Starlette(routes=[Route("/x", lambda _: PlainTextResponse("ok"))])
    return TestClient(HostCheck(inner, names), base_url=f"http://{host}")


@pytest.mark.parametrize(
    ("host", "status"),
    [
        ("localhost:8080", 200),
        ("10.1.2.3:8080", 200),  # an address involves no DNS: nothing to rebind
        ("[fe80::1]:8080", 200),
        ("box.lan", 200),
        ("evil.example:8080", 403),
        ("localhost.evil.example", 403),
    ],
)
def test_foreign_names_get_403_in_the_openai_envelope(host: str, status: int) -> None:
    with _client(allowed_names(("127.0.0.1",), ("box.lan",)), host) as c:
        r = c.get("/x")
    assert r.status_code == status
    if status == 403:
        error = r.json()["error"]
        assert (error["code"], error["type"]) == (403, "permission_error")
        assert f"Host {host_name(host)!r} is not served" in error["message"]
    else:
        assert r.text == "ok"


def test_no_check_with_a_key_or_a_star() -> None:
    with _client(None, "evil.example") as c:
        assert c.get("/x").text == "ok"


def load(*argv: str):
    return load_server_settings(list(argv), {})[0]


def test_allowed_hosts_flag() -> None:
    assert load().limits.allowed_hosts == ()
    assert load("--allowed-hosts", "Box.LAN, api.lan").limits.allowed_hosts == (
        "box.lan",
        "api.lan",
    )
    assert load("--allowed-hosts", "*").limits.allowed_hosts == ("*",)
    for bad, message in (
        ("http://box.lan", "invalid host name 'http://box.lan'"),
        ("box.lan:80", "invalid host name 'box.lan:80'"),
        ("*,box.lan", "'*' serves every host: give it alone"),
    ):
        with pytest.raises(ConfigError, match="argument --allowed-hosts: ") as info:
            load("--allowed-hosts", bad)
        assert message in str(info.value)
