"""Resource bounds of kvmem-server (flags `--max-body-size`, `--header-timeout`,
`--body-timeout`, `--keep-alive-timeout`, `--max-connections`, `-to/--timeout`,
`--threads-http`, `--cors-*`) and the parsers of their values."""

from __future__ import annotations

import argparse
import math
import re
from dataclasses import dataclass

DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_BODY_TIMEOUT_S = 60.0
DEFAULT_KEEP_ALIVE_TIMEOUT_S = 5.0
DEFAULT_MAX_CONNECTIONS = 1000
# -to/--timeout: llama-server's read/write timeout (3600 s there; 600 here, because a client
# that stops reading its stream holds a lane for that long)
DEFAULT_TIMEOUT_S = 600
DEFAULT_CORS_METHODS = ("GET", "POST", "DELETE", "OPTIONS")  # llama-server's
DEFAULT_CORS_HEADERS = ("*",)

_SIZE = re.compile(r"^\s*(\d+)\s*([kKmMgG]i?[bB]?|[bB])?\s*$")
_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}
_HOST_NAME = re.compile(
    r"[a-z0-9]([a-z0-9\-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9\-]{0,61}[a-z0-9])?)*\.?"
)
_ORIGIN = re.compile(r"^(https?)://([A-Za-z0-9.\-]+|\[[0-9A-Fa-f:.]+\])(:\d{1,5})?$")


@dataclass(frozen=True, slots=True)
class ServerLimits:
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    keep_alive_timeout_s: float = DEFAULT_KEEP_ALIVE_TIMEOUT_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    cors_origins: tuple[str, ...] = ()  # (): same-origin only; ("*",): every origin
    cors_methods: tuple[str, ...] = DEFAULT_CORS_METHODS
    cors_headers: tuple[str, ...] = DEFAULT_CORS_HEADERS  # ("*",): the headers asked for
    cors_credentials: bool = True
    allowed_hosts: tuple[str, ...] = ()  # names served without an API key; ("*",): every one
    write_timeout_s: float = float(DEFAULT_TIMEOUT_S)  # a stalled response write closes
    threads_http: int | None = None  # the worker-thread limit of blocking work; None: 40


def byte_size(text: str) -> int:
    """`1048576`, `512K`, `32M`, `1G` (binary units; a trailing B or iB is allowed)."""
    match = _SIZE.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"invalid size {text!r}: use bytes or K/M/G, e.g. 32M")
    unit = (match.group(2) or "").lower()[:1]
    value = int(match.group(1)) * _UNITS[unit]
    if value < 1024:
        raise argparse.ArgumentTypeError(f"{text!r} is too small: at least 1K")
    return value


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number of seconds {text!r}") from None
    if not math.isfinite(value) or value <= 0 or value > 86400:
        raise argparse.ArgumentTypeError(f"{text!r} is out of range: must be in (0, 86400] s")
    return value


def host_names(text: str) -> tuple[str, ...]:
    """A comma list of host names (no scheme, no port), or `*` alone."""
    items = [item.strip().lower() for item in text.split(",") if item.strip()]
    if not items:
        raise argparse.ArgumentTypeError("empty host list: give host names or '*'")
    if "*" in items:
        if len(items) > 1:
            raise argparse.ArgumentTypeError("'*' serves every host: give it alone")
        return ("*",)
    for item in items:
        if not _HOST_NAME.fullmatch(item):
            raise argparse.ArgumentTypeError(
                f"invalid host name {item!r}: give a name such as myhost.lan, without scheme or port"
            )
    return tuple(items)


def cors_origins(text: str) -> tuple[str, ...]:
    """`*` (every origin, explicitly), `localhost` (llama-server's special value: any origin
    on localhost, 127.0.0.1 or [::1], any port) or a comma list of `scheme://host[:port]`."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise argparse.ArgumentTypeError("empty origin list: give origins or '*'")
    if "localhost" in [item.lower() for item in items]:
        if len(items) > 1:
            raise argparse.ArgumentTypeError("'localhost' allows every local origin: give it alone")
        return ("localhost",)
    if "*" in items:
        if len(items) > 1:
            raise argparse.ArgumentTypeError("'*' allows every origin: give it alone")
        return ("*",)
    for item in items:
        if not _ORIGIN.match(item):
            raise argparse.ArgumentTypeError(
                f"invalid origin {item!r}: use scheme://host[:port], e.g. http://localhost:5173"
            )
    return tuple(item.lower() for item in items)
