"""`kvmem-rpc-worker`'s flags: lend this machine's devices to a kvmem-server over llama.cpp's RPC.

The worker is llama.cpp's own RPC server (`ggml_backend_rpc_start_server`, as its
`rpc-server` tool calls it), serving the local GPUs, or the CPU where there are none. A
kvmem-server started with `--rpc HOST:PORT` puts some of the model's layers, their
weights and their KV cache here. The protocol has no authentication and no encryption:
whoever reaches the port can run work on it and read what it holds, so it binds to
127.0.0.1 unless `--host` says otherwise, and warns then.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import socket
import sys
from collections.abc import Callable, Sequence

from kvmem.errors import ConfigError, KVMemError
from kvmem.settings.rpc_endpoints import DEFAULT_PORT, LOOPBACK, RpcEndpoint

logger = logging.getLogger(__name__)
PROG = "kvmem-rpc-worker"


def _ipv4(text: str) -> str:
    try:
        return str(ipaddress.IPv4Address(text))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid host {text!r}: ggml-rpc binds to an IPv4 address, e.g. 127.0.0.1"
        ) from None


def _port(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}: use 1-65535")
    return int(text)


def _threads(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"invalid thread count {text!r}: use 1 or more")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Serve this machine's devices to kvmem-server --rpc (llama.cpp's RPC "
        "protocol: no authentication, trusted networks only).",
    )
    parser.add_argument("--host", type=_ipv4, default=LOOPBACK, help="IPv4 address to bind")
    parser.add_argument("--port", type=_port, default=DEFAULT_PORT, help="TCP port")
    parser.add_argument(
        "-t",
        "--threads",
        type=_threads,
        default=max(1, (os.cpu_count() or 2) // 2),
        help="threads of the CPU device (default: half the cores)",
    )
    parser.add_argument(
        "--cache-dir",
        default=None,
        metavar="DIR",
        help="cache tensors sent by hash here, so a restarted host loads them locally "
        "(default: no cache)",
    )
    return parser


def check_port_free(endpoint: RpcEndpoint) -> None:
    """Bind as ggml-rpc will (SO_REUSEADDR) and let go: a taken port is named, not a
    bare 'Failed to create server socket' from the library."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((endpoint.host, endpoint.port))
        except OSError as exc:
            raise ConfigError(
                "--port", f"cannot listen on {endpoint}: {exc.strerror or exc}"
            ) from None


Serve = Callable[[RpcEndpoint, str | None, int], None]  # kvmem.engine.llama.rpc.serve_worker


def run(argv: Sequence[str] | None, serve: Serve) -> int:
    """kvmem-rpc-worker's flags and checks, then `serve` (kvmem.console.rpc_worker passes
    llama.cpp's RPC server): its exit status."""
    ns = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format=f"{PROG}: %(message)s")
    endpoint = RpcEndpoint(ns.host, ns.port)
    if not ipaddress.IPv4Address(ns.host).is_loopback:
        logger.warning(
            "listening on %s: the RPC protocol has no authentication; anyone who reaches this "
            "port can run work on this machine and read its memory. Use a trusted network only.",
            endpoint,
        )
    try:
        check_port_free(endpoint)
        serve(endpoint, ns.cache_dir, ns.threads)
    except KeyboardInterrupt:
        return 0
    except KVMemError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    return 0
