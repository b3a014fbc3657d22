"""CORS, in one place: every `OPTIONS` request is answered here, before authentication
and routing, as llama-server answers them: `200` with an empty body, public (browsers send
no `Authorization` on a preflight).

Which origins get `Access-Control-Allow-Origin` (the request's origin, reflected), three cases:

- `--cors-origins` given: the origins it allows (a listed origin, any origin with `*`, any
  origin on the local host with `localhost`); `Access-Control-Allow-Headers` is
  `--cors-headers`, or with `*` (the default) the headers the preflight asks for (a browser
  does not let `*` cover `Authorization`).
- no `--cors-origins`, an API key: every origin, as llama-server answers (the key protects
  the server): `Access-Control-Allow-Headers` is `--cors-headers` as written (`*`).
- no `--cors-origins`, no API key: no origin (same-origin only), so a preflight from another
  site gets no `Access-Control-Allow-Origin` and the browser sends nothing (a page the user
  visits cannot drive a keyless local server; see host_check.py for DNS rebinding).

`Access-Control-Allow-Methods` is `--cors-methods`; `Access-Control-Allow-Credentials` is
`--cors-credentials`. Other requests go on to the app; the responses to an allowed origin
get `Access-Control-Allow-Origin` (and `Access-Control-Allow-Credentials` with
`--cors-credentials`), so its page can read them; others get no CORS header.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from kvmem.cli.limit_flags import ServerLimits

LOCALHOST_ORIGIN = re.compile(r"https?://(localhost|127\.0\.0\.1|\[::1\])(:[0-9]{1,5})?")
PREFLIGHT_STATUS = 200  # llama-server's (cpp-httplib's default); its test suite asserts it
EVERY_ORIGIN = ("*",)


@dataclass(frozen=True, slots=True)
class CorsPolicy:
    """The CORS answers of one server (the module docstring's three cases)."""

    origins: tuple[str, ...]  # as --cors-origins parses them; (): none
    methods: tuple[str, ...]
    headers: tuple[str, ...]  # --cors-headers
    echo_asked: bool  # headers ("*",) answer the headers the preflight asks for
    credentials: bool

    @classmethod
    def of(cls, limits: ServerLimits, keyed: bool) -> CorsPolicy:
        """The policy of a server with these limits, with (`keyed`) or without an API key."""
        like_llama_server = keyed and not limits.cors_origins
        return cls(
            origins=EVERY_ORIGIN if like_llama_server else limits.cors_origins,
            methods=limits.cors_methods,
            headers=limits.cors_headers,
            echo_asked=not like_llama_server,
            credentials=limits.cors_credentials,
        )

    def allows(self, origin: str) -> bool:
        return origin_allowed(self.origins, origin)


def origin_allowed(origins: tuple[str, ...], origin: str) -> bool:
    """Whether `--cors-origins` (`origins`, as parsed) allows `origin`."""
    if not origin:
        return False
    if origins == ("*",):
        return True
    if origins == ("localhost",):
        return LOCALHOST_ORIGIN.fullmatch(origin) is not None
    return origin.lower() in origins


def _header(scope: Any, name: bytes) -> str:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return bytes(value).decode("latin-1").strip()
    return ""


def preflight_headers(policy: CorsPolicy, origin: str, asked: str) -> list[tuple[bytes, bytes]]:
    """The headers of the answer to a preflight from `origin` asking for headers `asked`."""
    echo = policy.echo_asked and policy.headers == ("*",)
    allow_headers = (asked or "*") if echo else ", ".join(policy.headers)
    headers = [
        (b"Content-Length", b"0"),
        (b"Access-Control-Allow-Methods", ", ".join(policy.methods).encode()),
        (b"Access-Control-Allow-Headers", allow_headers.encode("latin-1")),
        (b"Access-Control-Allow-Credentials", b"true" if policy.credentials else b"false"),
        (b"Vary", b"Origin"),
    ]
    if policy.allows(origin):
        headers.insert(0, (b"Access-Control-Allow-Origin", origin.encode("latin-1")))
    return headers


def _response_headers(policy: CorsPolicy, origin: str) -> list[tuple[bytes, bytes]]:
    """The CORS headers of a response (not a preflight) to a request from `origin`."""
    if not policy.allows(origin):
        return []
    headers = [(b"Access-Control-Allow-Origin", origin.encode("latin-1")), (b"Vary", b"Origin")]
    if policy.credentials:
        headers.append((b"Access-Control-Allow-Credentials", b"true"))
    return headers


class Cors:
    """ASGI middleware: answers `OPTIONS` requests and adds the CORS headers of allowed
    origins to other responses (see the module's docstring)."""

    def __init__(self, app: Any, policy: CorsPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["method"] != "OPTIONS":
            extra = _response_headers(self.policy, _header(scope, b"origin"))
            if not extra:
                await self.app(scope, receive, send)
                return

            async def with_cors(message: Any) -> None:
                if message["type"] == "http.response.start":
                    message = {**message, "headers": [*message.get("headers", []), *extra]}
                await send(message)

            await self.app(scope, receive, with_cors)
            return
        headers = preflight_headers(
            self.policy,
            _header(scope, b"origin"),
            _header(scope, b"access-control-request-headers"),
        )
        await send({"type": "http.response.start", "status": PREFLIGHT_STATUS, "headers": headers})
        await send({"type": "http.response.body", "body": b""})
