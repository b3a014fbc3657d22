"""NetworkMeter reads the kernel's TCP byte counters of the connections to the workers:
real loopback sockets, exact byte counts."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from kvmem.engine.transfer.rpc_traffic import NetworkMeter
from kvmem.engine.transfer.transfer_profile import TransferPath, TransferProfile
from kvmem.settings.rpc_endpoints import RpcEndpoint


class EchoServer:
    """Reads `n` bytes per request and answers with `n` bytes back, doubled."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        with conn:
            while data := conn.recv(1 << 16):
                conn.sendall(data * 2)


@pytest.fixture()
def link() -> Iterator[tuple[socket.socket, RpcEndpoint]]:
    server = EchoServer()
    client = socket.create_connection(("127.0.0.1", server.port))
    yield client, RpcEndpoint("127.0.0.1", server.port)
    client.close()
    server.sock.close()


def _exchange(client: socket.socket, n: int) -> None:
    client.sendall(b"x" * n)
    got = 0
    while got < 2 * n:
        got += len(client.recv(1 << 16))


def _settled(meter: NetworkMeter, total: int) -> int:
    """The counter once the last ACK is in (loopback: at once, give it a moment)."""
    for _ in range(100):
        if meter.total() == total:
            break
        time.sleep(0.01)
    return meter.total()


def test_meter_counts_the_bytes_sent_and_received(link: tuple[socket.socket, RpcEndpoint]) -> None:
    client, endpoint = link
    meter = NetworkMeter((endpoint,))
    start = meter.read()  # data bytes only (the handshake's SYN is not written data)
    assert (start.sent, start.received) == (0, 0)
    _exchange(client, 10_000)
    assert _settled(meter, 30_000) == 30_000
    count = meter.read()
    assert (count.sent - start.sent, count.received) == (10_000, 20_000)


def test_meter_ignores_other_connections(link: tuple[socket.socket, RpcEndpoint]) -> None:
    client, endpoint = link
    other = NetworkMeter((RpcEndpoint("127.0.0.1", 1),))
    _exchange(client, 1000)
    assert other.total() == 0


def test_profile_attributes_network_bytes_to_the_timed_path(
    link: tuple[socket.socket, RpcEndpoint],
) -> None:
    client, endpoint = link
    meter = NetworkMeter((endpoint,))
    profile = TransferProfile(network=meter)
    start = meter.total()
    with profile.timed(TransferPath.STATE_GET, n_bytes=4096):
        _exchange(client, 4096)
        _settled(meter, start + 3 * 4096)
    mark = profile.net_mark()
    _exchange(client, 100)
    _settled(meter, start + 3 * 4096 + 300)
    profile.add(TransferPath.PREFILL_DECODE, 1.0, net_bytes=profile.net_mark() - mark)
    snap = profile.snapshot()
    assert snap["state_get"]["net_bytes"] == 3 * 4096
    assert snap["state_get"]["bytes"] == 4096
    assert snap["prefill_decode"]["net_bytes"] == 300
    assert "state_set" not in snap


def test_a_profile_without_workers_reports_no_network_bytes() -> None:
    profile = TransferProfile()
    with profile.timed(TransferPath.STATE_GET, n_bytes=10):
        pass
    assert profile.net_mark() == 0
    assert "net_bytes" not in profile.snapshot()["state_get"]


def test_bytes_still_queued_count_as_sent() -> None:
    """ggml-rpc's set_tensor returns before its bytes are acknowledged: the meter counts
    what was written, also what still waits in the send queue of a peer that does not read."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    client = socket.create_connection(server.getsockname())
    peer, _ = server.accept()  # never reads
    try:
        meter = NetworkMeter((RpcEndpoint("127.0.0.1", server.getsockname()[1]),))
        start = meter.read()
        client.setblocking(False)
        written = 0
        while True:
            try:
                written += client.send(b"y" * 65536)
            except BlockingIOError:
                break
        count = meter.read()
        assert count.sent - start.sent == written
        assert count.received == start.received == 0
    finally:
        client.close()
        peer.close()
        server.close()
