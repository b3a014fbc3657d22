"""`-to/--timeout`'s write timeout (kvmem.server.connection_guard): a client that stops
reading a streamed response has its connection aborted once the socket stays full for the
timeout, and the app sees the disconnect. A real uvicorn server on a local port, a raw
socket client with a small receive buffer that never reads."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn

from kvmem.server.connection_guard import guarded_protocol

CHUNK = b"x" * 65536


class StreamForever:
    """An ASGI app streaming without end; records when its stream stopped and why."""

    def __init__(self) -> None:
        self.ended = threading.Event()
        self.how = ""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        gone = asyncio.ensure_future(receive())  # the request, then http.disconnect
        await gone
        gone = asyncio.ensure_future(receive())
        await send({"type": "http.response.start", "status": 200, "headers": []})
        try:
            while not gone.done():
                await send({"type": "http.response.body", "body": CHUNK, "more_body": True})
            self.how = gone.result()["type"]
        except OSError as exc:
            self.how = type(exc).__name__
        finally:
            gone.cancel()
            self.ended.set()


def _serve(app: StreamForever, write_timeout_s: float | None) -> tuple[uvicorn.Server, int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        app,
        lifespan="off",
        log_config=None,
        log_level="warning",
        http=guarded_protocol(10.0, 100, write_timeout_s),
    )
    server = uvicorn.Server(config)
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    return server, sock.getsockname()[1]


@pytest.fixture
def stalled_client() -> Iterator[Any]:
    opened: list[socket.socket] = []

    def connect(port: int) -> socket.socket:
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.connect(("127.0.0.1", port))
        client.sendall(b"GET / HTTP/1.1\r\nHost: test\r\n\r\n")
        opened.append(client)
        return client  # and never read from it

    yield connect
    for client in opened:
        client.close()


def test_a_stalled_reader_is_disconnected_after_the_write_timeout(stalled_client: Any) -> None:
    app = StreamForever()
    server, port = _serve(app, write_timeout_s=0.5)
    try:
        stalled_client(port)
        assert app.ended.wait(15), "the stream was never stopped"
        assert app.how in ("http.disconnect", "ClientDisconnected")
    finally:
        server.should_exit = True


def test_without_a_write_timeout_the_stream_waits(stalled_client: Any) -> None:
    app = StreamForever()
    server, port = _serve(app, write_timeout_s=None)
    try:
        stalled_client(port)
        assert not app.ended.wait(2.0)  # still blocked on the full socket
    finally:
        server.should_exit = True  # exits once the fixture closes the client
