"""RPC worker addresses and where the model's layers live (no llama_cpp).

`--rpc HOST:PORT[,HOST:PORT...]` is spelled as llama-server spells it; the CLI, the
server and the launcher parse it here before anything loads. `LayerPlacement` is what
`/props` and `KVMEM_STARTUP` report: each repeating layer's device, read back from
llama.cpp's load log (kvmem.engine.llama.rpc).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvmem.errors import ConfigError

LOOPBACK = "127.0.0.1"
DEFAULT_PORT = 50052  # llama.cpp's rpc-server default
_HOST_PORT = re.compile(r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9_.-]+)):(?P<port>\d+)$")
_LAYER_LINE = re.compile(r"layer\s+(\d+) assigned to device (\S+?),")


@dataclass(frozen=True, slots=True)
class RpcEndpoint:
    """One worker: `host:port` as ggml-rpc takes it."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_endpoint(text: str, flag: str = "--rpc") -> RpcEndpoint:
    match = _HOST_PORT.match(text.strip())
    if match is None:
        raise ConfigError(flag, f"invalid RPC worker {text!r}: use HOST:PORT, e.g. 127.0.0.1:50052")
    port = int(match.group("port"))
    if not 0 < port < 65536:
        raise ConfigError(flag, f"invalid port {port} in {text!r}: use 1-65535")
    return RpcEndpoint(match.group("v6") or match.group("host"), port)


def parse_endpoints(text: str, flag: str = "--rpc") -> tuple[RpcEndpoint, ...]:
    """`HOST:PORT[,HOST:PORT...]`; a worker named twice is an error (its layers would be
    counted twice)."""
    parts = [p for p in text.split(",")]
    if not text.strip() or not all(p.strip() for p in parts):
        raise ConfigError(flag, f"invalid RPC worker list {text!r}: use HOST:PORT[,HOST:PORT...]")
    endpoints = tuple(parse_endpoint(p, flag) for p in parts)
    seen: set[RpcEndpoint] = set()
    for endpoint in endpoints:
        if endpoint in seen:
            raise ConfigError(flag, f"the RPC worker {endpoint} is listed twice")
        seen.add(endpoint)
    return endpoints


@dataclass(frozen=True, slots=True)
class LayerRange:
    """Consecutive layers [first, last] on one device."""

    device: str  # llama.cpp's device name: CPU, CUDA0, RPC0, ...
    endpoint: str | None  # the RPC worker behind the device, None for a local one
    first: int
    last: int

    @property
    def n_layers(self) -> int:
        return self.last - self.first + 1


@dataclass(frozen=True, slots=True)
class LayerPlacement:
    """Each repeating layer's device, as llama.cpp assigned it at load time."""

    devices: tuple[str, ...]  # [n_layer]: device name of repeating layer i
    output: str | None = None  # the output layer's device
    endpoints: tuple[tuple[str, str], ...] = ()  # (device name, RPC endpoint) pairs

    @classmethod
    def from_log(cls, lines: list[str], endpoints: dict[str, str]) -> LayerPlacement:
        """From llama.cpp's `load_tensors: layer N assigned to device D, ...` lines; the
        last index logged is the output layer (llama-model.cpp load_tensors)."""
        found: dict[int, str] = {}
        for line in lines:
            match = _LAYER_LINE.search(line)
            if match is not None:
                found[int(match.group(1))] = match.group(2)
        if not found:
            return cls((), None, tuple(sorted(endpoints.items())))
        order = sorted(found)
        devices = tuple(found[i] for i in order[:-1])
        return cls(devices, found[order[-1]], tuple(sorted(endpoints.items())))

    def ranges(self) -> list[LayerRange]:
        by_device = dict(self.endpoints)
        out: list[LayerRange] = []
        for i, device in enumerate(self.devices):
            if out and out[-1].device == device and out[-1].last == i - 1:
                last = out[-1]
                out[-1] = LayerRange(device, last.endpoint, last.first, i)
            else:
                out.append(LayerRange(device, by_device.get(device), i, i))
        return out

    @property
    def remote_layers(self) -> int:
        by_device = dict(self.endpoints)
        return sum(1 for d in self.devices if d in by_device)

    def as_json(self) -> dict[str, object]:
        """{"layers": [{device, endpoint, first, last}] in layer order, "output": {device,
        endpoint}} (/props, KVMEM_STARTUP)."""
        by_device = dict(self.endpoints)
        return {
            "layers": [
                {"device": r.device, "endpoint": r.endpoint, "first": r.first, "last": r.last}
                for r in self.ranges()
            ],
            "output": {"device": self.output, "endpoint": by_device.get(self.output or "")},
        }
