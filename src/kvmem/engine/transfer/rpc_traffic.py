"""Bytes on the wire to the RPC workers, read from the kernel (Linux TCP_INFO).

ggml-rpc keeps one TCP connection per worker. `NetworkMeter` finds this process's
established connections to the workers (/proc/self/net/tcp*, /proc/self/fd) and sums
the bytes this process wrote to them and `tcpi_bytes_received`. Written is what the
kernel sent once (`tcpi_bytes_sent - tcpi_bytes_retrans`) plus what still waits in the
send queue (`tcpi_notsent_bytes`): a call that returns before its bytes are acknowledged
(ggml-rpc's `set_tensor` does not wait for an answer) still counts them, so a path's
count does not depend on when the worker's acknowledgements arrive. The transfer profile
reads it around each timed path, so the network bytes of harvest, restore, query capture
and decode are measured, not estimated. No llama_cpp here.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
from dataclasses import dataclass

from kvmem.settings.rpc_endpoints import RpcEndpoint

_TCP_INFO_LEN = 256
# offsets in struct tcp_info (linux/tcp.h)
_BYTES_ACKED = 120  # u64, then tcpi_bytes_received (u64)
_NOTSENT = 144  # u32 tcpi_notsent_bytes
_BYTES_SENT = 200  # u64, then tcpi_bytes_retrans (u64); Linux 4.19 and later
_ESTABLISHED = "01"


@dataclass(frozen=True, slots=True)
class TrafficCount:
    sent: int
    received: int

    @property
    def total(self) -> int:
        return self.sent + self.received


def _hex_address(host: str, port: int) -> set[str]:
    """How /proc/net/tcp{,6} spells host:port (each 32-bit word little-endian)."""
    out: set[str] = set()
    for family, _, _, _, sockaddr in socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP):
        packed = ipaddress.ip_address(sockaddr[0]).packed
        if family == socket.AF_INET:
            packed_v6 = b"\0" * 10 + b"\xff\xff" + packed  # IPv4-mapped, as tcp6 shows it
            out.add(f"{struct.unpack('<I', packed)[0]:08X}:{port:04X}")
        else:
            packed_v6 = packed
        words = struct.unpack("<4I", packed_v6)
        out.add("".join(f"{w:08X}" for w in words) + f":{port:04X}")
    return out


def _socket_inodes(remotes: set[str]) -> set[str]:
    inodes: set[str] = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            with open(table, encoding="ascii") as f:
                next(f)
                for line in f:
                    cols = line.split()
                    if cols[2] in remotes and cols[3] == _ESTABLISHED:
                        inodes.add(cols[9])
        except OSError:
            continue
    return inodes


def _fds_of(inodes: set[str]) -> list[int]:
    fds: list[int] = []
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in inodes:
            fds.append(int(name))
    return fds


def tcp_bytes(fd: int) -> TrafficCount | None:
    """The kernel's byte counters of a TCP socket, or None when `fd` is not one any more."""
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LEN)
    except OSError:
        return None
    finally:
        sock.close()
    if len(info) < _BYTES_ACKED + 16:
        return None
    acked, received = struct.unpack_from("<QQ", info, _BYTES_ACKED)
    if len(info) < _BYTES_SENT + 16:  # an older kernel: only what was acknowledged
        return TrafficCount(acked, received)
    sent_once, retrans = struct.unpack_from("<QQ", info, _BYTES_SENT)
    (queued,) = struct.unpack_from("<I", info, _NOTSENT)
    return TrafficCount(sent_once - retrans + queued, received)


class NetworkMeter:
    """The bytes exchanged so far with a set of RPC workers (connections found lazily)."""

    def __init__(self, endpoints: tuple[RpcEndpoint, ...]) -> None:
        self._remotes: set[str] = set()
        for endpoint in endpoints:
            self._remotes |= _hex_address(endpoint.host, endpoint.port)
        self._fds: list[int] = []

    def _find(self) -> None:
        self._fds = _fds_of(_socket_inodes(self._remotes))

    def read(self) -> TrafficCount:
        if not self._fds:
            self._find()
        counts = [tcp_bytes(fd) for fd in self._fds]
        if any(c is None for c in counts):  # a connection went away: look again
            self._find()
            counts = [tcp_bytes(fd) for fd in self._fds]
        found = [c for c in counts if c is not None]
        return TrafficCount(sum(c.sent for c in found), sum(c.received for c in found))

    def total(self) -> int:
        return self.read().total
