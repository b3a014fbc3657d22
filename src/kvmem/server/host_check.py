"""The Host check: a defence against DNS rebinding for servers without an API key.

A page on a rebinding domain (`evil.example` resolving to 127.0.0.1 after the page loaded)
reaches a local server as same-origin, so CORS does not stop it; the one thing it cannot
hide is its own name in the `Host` header. So a server without `--api-key` serves only
requests whose Host is an IP address (no DNS involved), `localhost`, a name it binds
(`--host`) or a name in `--allowed-hosts` (`*` turns the check off). Others get 403 in the
OpenAI error envelope, before routing. With an API key the key is the defence and every
Host is served. A request without a Host header (HTTP/1.0) is served: browsers always
send one.
"""

from __future__ import annotations

import ipaddress
import json
from typing import Any

from kvmem.server.settings import ServerSettings

ALWAYS = frozenset({"localhost"})


def host_name(header: str) -> str:
    """The host name of a Host header value: lowercased, without port or IPv6 brackets."""
    value = header.strip().lower()
    if value.startswith("["):  # [v6]:port
        return value[1 : value.find("]")] if "]" in value else value
    if value.count(":") == 1:
        value = value.split(":", 1)[0]
    return value.rstrip(".")


def is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def allowed_names(binds: tuple[str, ...], extra: tuple[str, ...]) -> frozenset[str] | None:
    """The names served besides IP addresses; None: every Host (`--allowed-hosts *`)."""
    if "*" in extra:
        return None
    return ALWAYS | {host_name(h) for h in binds} | {host_name(h) for h in extra}


def served_names(settings: ServerSettings) -> frozenset[str] | None:
    """What a server with `settings` answers to: every Host with an API key."""
    if settings.api_keys.enabled:
        return None
    return allowed_names(settings.hosts, settings.limits.allowed_hosts)


def host_served(header: str | None, names: frozenset[str] | None) -> bool:
    if names is None or header is None:
        return True
    name = host_name(header)
    return is_ip(name) or name in names


def _header(scope: Any, wanted: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if bytes(key).lower() == wanted:
            return bytes(value).decode("latin-1")
    return None


class HostCheck:
    """ASGI middleware: 403 for a Host the server does not answer to (module docstring);
    `names` None (an API key is configured, or `--allowed-hosts *`) passes everything."""

    def __init__(self, app: Any, names: frozenset[str] | None) -> None:
        self.app = app
        self.names = names

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or host_served(_header(scope, b"host"), self.names):
            await self.app(scope, receive, send)
            return
        name = host_name(_header(scope, b"host") or "")
        body = json.dumps(
            {
                "error": {
                    "code": 403,
                    "message": (
                        f"Host {name!r} is not served without an API key (DNS rebinding "
                        "defence): use an IP address or localhost, add the name with "
                        "--allowed-hosts, or set --api-key"
                    ),
                    "type": "permission_error",
                }
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 403,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
