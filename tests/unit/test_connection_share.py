"""The per-client share of the connection cap (kvmem.server.connection_guard): a client
past its share loses its oldest idle connection, a client whose connections are all busy
gets the new one closed, and at the cap the largest holder's oldest idle one makes room.
A real uvicorn server on a local port; raw sockets from 127.0.0.x as separate clients."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn

from kvmem.server.connection_guard import guarded_protocol, per_client_limit

REQUEST = b"GET / HTTP/1.1\r\nHost: test\r\n\r\n"


class HoldRequests:
    """An ASGI app that keeps every request open until `release` is set."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.running = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        self.running += 1
        while not self.release.is_set():
            await asyncio.sleep(0.02)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture
def served() -> Iterator[tuple[HoldRequests, int, list[socket.socket]]]:
    app = HoldRequests()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        app,
        lifespan="off",
        log_config=None,
        log_level="warning",
        http=guarded_protocol(30.0, 6, None, per_client=3),
    )
    server = uvicorn.Server(config)
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    opened: list[socket.socket] = []
    yield app, sock.getsockname()[1], opened
    app.release.set()
    for client in opened:
        client.close()
    server.should_exit = True


def _connect(port: int, opened: list[socket.socket], source: str = "127.0.0.1") -> socket.socket:
    client = socket.socket()
    client.bind((source, 0))
    client.connect(("127.0.0.1", port))
    opened.append(client)
    time.sleep(0.1)  # the server has run connection_made
    return client


def _closed(client: socket.socket, wait_s: float = 1.0) -> bool:
    client.settimeout(wait_s)
    try:
        return client.recv(1) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_the_default_share_is_half_the_cap() -> None:
    assert per_client_limit(None, 1000) == 500
    assert per_client_limit(50, 1000) == 50
    assert per_client_limit(5000, 1000) == 1000


def test_past_its_share_a_client_loses_its_oldest_idle_connection(served: Any) -> None:
    _, port, opened = served
    idle = [_connect(port, opened) for _ in range(3)]
    newest = _connect(port, opened)
    assert _closed(idle[0])
    assert not any(_closed(c, 0.2) for c in (*idle[1:], newest))
    other = _connect(port, opened, "127.0.0.2")  # another client is not touched
    assert not _closed(other, 0.2) and not _closed(idle[1], 0.2)


def test_a_client_whose_connections_are_busy_gets_the_new_one_closed(served: Any) -> None:
    app, port, opened = served
    busy = [_connect(port, opened) for _ in range(3)]
    for client in busy:
        client.sendall(REQUEST)
    deadline = time.monotonic() + 5
    while app.running < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    refused = _connect(port, opened)
    assert _closed(refused)
    assert not any(_closed(c, 0.2) for c in busy)
    app.release.set()
    for client in busy:
        client.settimeout(5)
        assert client.recv(200).startswith(b"HTTP/1.1 200 OK")


def test_at_the_cap_the_largest_holders_oldest_idle_connection_makes_room(served: Any) -> None:
    _, port, opened = served
    first = [_connect(port, opened, "127.0.0.2") for _ in range(3)]
    second = [_connect(port, opened, "127.0.0.3") for _ in range(2)]
    third = _connect(port, opened, "127.0.0.4")  # 6 open: the cap
    assert not any(_closed(c, 0.2) for c in (*first, *second, third))
    fourth = _connect(port, opened, "127.0.0.5")
    assert _closed(first[0])
    assert not any(_closed(c, 0.2) for c in (*first[1:], *second, third, fourth))
