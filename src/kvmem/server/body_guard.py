"""An ASGI middleware between the HTTP protocol and the app: bodies, media types, HEAD.

- POST bodies must be `Content-Type: application/json` (415 otherwise). A browser cannot
  send that type cross-origin without a CORS preflight, which `--cors-origins` decides.
- The whole body is read here, at most `--max-body-size` bytes (413 from the declared
  Content-Length, or as soon as the streamed body passes the limit) and within
  `--body-timeout` seconds of the request's start (408 otherwise: a body trickled byte by
  byte, or one shorter than its Content-Length, no longer holds a connection forever).
  Before a 413 the rest of the body is read and dropped (at most `DRAIN_LIMIT` bytes,
  within the same deadline, and only while it keeps coming: `DRAIN_IDLE_S` without a byte
  ends it): closing a socket with unread bytes makes the kernel reset the connection, and
  the client would lose the 413 it was sent. A declared length over the limit with
  `Expect: 100-continue` is answered 413 at once, without `100 Continue` (the client sends
  nothing until told to).
  The app then receives the body in one message, and the client's disconnect after it.
- A request with both Content-Length and Transfer-Encoding is refused (400) and its
  connection closed, as RFC 9112 section 6.1 allows and requires (request smuggling).
- A client that leaves while sending its body ends the request silently (no traceback).
- HEAD is answered like GET (the HTTP layer drops the body).
- Errors on the Anthropic routes (/v1/messages...) use Anthropic's envelope.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from kvmem.server.error_map import anthropic_error_type

logger = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

JSON_TYPES = ("application/json",)
DRAIN_LIMIT = 64 * 1024 * 1024  # bytes of an oversized body read and dropped before the 413
DRAIN_IDLE_S = 1.0  # a refused body that sends nothing for this long is not waited for


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value
    return None


def media_type(value: bytes | None) -> str:
    if value is None:
        return ""
    return value.split(b";", 1)[0].strip().lower().decode("latin-1")


# True while a request to an Anthropic route is guarded: its errors use that API's envelope
_ANTHROPIC = contextvars.ContextVar("kvmem_anthropic_route", default=False)
ANTHROPIC_PREFIX = "/v1/messages"


async def send_error(send: Send, status: int, message: str, type_: str, code: str) -> None:
    error: dict[str, Any] = (
        {"type": "error", "error": {"type": anthropic_error_type(status), "message": message}}
        if _ANTHROPIC.get()
        else {"error": {"message": message, "type": type_, "param": None, "code": code}}
    )
    body = json.dumps(error).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class BodyGuard:
    def __init__(
        self,
        app: ASGIApp,
        *,
        max_body_bytes: int,
        body_timeout_s: float,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s
        self.on_error = on_error

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False
        _ANTHROPIC.set(str(scope.get("path", "")).startswith(ANTHROPIC_PREFIX))

        async def tracked_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self._guarded(scope, receive, tracked_send)
        except Exception as exc:  # a bug: logged once, counted, answered 500 if still possible
            if self.on_error is not None:
                self.on_error(exc)
            else:
                logger.exception("unexpected server error")
            if not started:
                await send_error(
                    send, 500, "internal server error", "server_error", "internal_error"
                )

    async def _guarded(self, scope: Scope, receive: Receive, send: Send) -> None:
        method = scope.get("method", "GET")
        if _header(scope, b"content-length") is not None and _header(scope, b"transfer-encoding"):
            await send_error(
                send,
                400,
                "a request may not carry both Content-Length and Transfer-Encoding",
                "invalid_request_error",
                "ambiguous_length",
            )
            return
        if method == "HEAD":
            scope = {**scope, "method": "GET"}
        if method not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        if media_type(_header(scope, b"content-type")) not in JSON_TYPES:
            await send_error(
                send,
                415,
                "the request body must be JSON, sent with 'Content-Type: application/json'",
                "invalid_request_error",
                "unsupported_media_type",
            )
            return
        declared = _header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            expect = (_header(scope, b"expect") or b"").strip().lower()
            if expect != b"100-continue":  # no receive(): the server sends no 100 Continue
                await self._drain(receive, time.monotonic() + self.body_timeout_s)
            await self._too_large(send)
            return
        body = await self._read_body(receive, send)
        if body is None:
            return
        await self.app(scope, _replay(body, receive), send)

    async def _too_large(self, send: Send) -> None:
        await send_error(
            send,
            413,
            f"the request body is larger than {self.max_body_bytes} bytes (--max-body-size)",
            "invalid_request_error",
            "payload_too_large",
        )

    @staticmethod
    async def _drain(receive: Receive, deadline: float) -> None:
        """Read and drop the rest of a refused body, up to DRAIN_LIMIT bytes or the deadline,
        while it keeps coming."""
        dropped = 0
        while dropped <= DRAIN_LIMIT:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            try:
                message = await asyncio.wait_for(receive(), min(remaining, DRAIN_IDLE_S))
            except asyncio.TimeoutError:
                return
            if message["type"] != "http.request" or not message.get("more_body", False):
                return
            dropped += len(message.get("body", b""))

    async def _read_body(self, receive: Receive, send: Send) -> bytes | None:
        """The whole body, or None after answering (413/408) or when the client left."""
        deadline = time.monotonic() + self.body_timeout_s
        parts: list[bytes] = []
        size = 0
        while True:
            remaining = deadline - time.monotonic()
            try:
                if remaining <= 0:
                    raise asyncio.TimeoutError
                message = await asyncio.wait_for(receive(), remaining)
            except asyncio.TimeoutError:
                logger.info("request body not received within %.0f s", self.body_timeout_s)
                await send_error(
                    send,
                    408,
                    f"the request body did not arrive within {self.body_timeout_s:g} s",
                    "invalid_request_error",
                    "request_timeout",
                )
                return None
            if message["type"] == "http.disconnect":
                logger.debug("client left while sending the request body")
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                if message.get("more_body", False):
                    await self._drain(receive, deadline)
                await self._too_large(send)
                return None
            parts.append(chunk)
            if not message.get("more_body", False):
                return b"".join(parts)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
