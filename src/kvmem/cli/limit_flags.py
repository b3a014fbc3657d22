"""Resource bounds of kvmem-server (flags `--max-body-size`, `--header-timeout`,
`--body-timeout`, `--keep-alive-timeout`, `--max-connections`, `-to/--timeout`,
`--threads-http`, `--cors-*`, `--allowed-hosts`, `--grammar-deadline`, declared on `ServerLimits`' fields) and the
parsers of their values."""

from __future__ import annotations

import argparse
import math
import re
from dataclasses import dataclass

from kvmem.settings import Group, setting
from kvmem.settings.values import int_in_range, threads_http, token_list

DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_BODY_TIMEOUT_S = 60.0
DEFAULT_KEEP_ALIVE_TIMEOUT_S = 5.0
DEFAULT_MAX_CONNECTIONS = 1000
DEFAULT_GRAMMAR_DEADLINE_S = 60.0
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


def deadline_seconds(text: str) -> float | None:
    """Seconds in (0, 86400], or 0: no deadline (None)."""
    if text.strip() in ("0", "0.0"):
        return None
    return seconds(text)


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


_SERVER = {"group": Group.SERVER}


def _automatic_threads(value: int) -> int | None:
    return value if value > 0 else None


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """The resource bounds; each field declares its flag. kvmem.cli.server_config sets
    `body_timeout_s` to -to/--timeout's value when only that is given."""

    max_body_bytes: int = setting(
        DEFAULT_MAX_BODY_BYTES, "--max-body-size", help="largest request body (bytes, or K/M/G)",
        parse=byte_size, metavar="SIZE", shown="32M", dest="max_body_size", **_SERVER,
    )  # fmt: skip
    header_timeout_s: float = setting(
        DEFAULT_HEADER_TIMEOUT_S, "--header-timeout",
        help="seconds a connection may take to send its headers", parse=seconds, metavar="S",
        dest="header_timeout", **_SERVER,
    )  # fmt: skip
    body_timeout_s: float = setting(
        DEFAULT_BODY_TIMEOUT_S, "--body-timeout",
        help="seconds a request may take to send its body", parse=seconds, metavar="S",
        shown=f"{DEFAULT_BODY_TIMEOUT_S:g}, or --timeout's value when that is given",
        dest="body_timeout", **_SERVER,
    )  # fmt: skip
    keep_alive_timeout_s: float = setting(
        DEFAULT_KEEP_ALIVE_TIMEOUT_S, "--keep-alive-timeout",
        help="seconds an idle keep-alive connection stays", parse=seconds, metavar="S",
        dest="keep_alive_timeout", **_SERVER,
    )  # fmt: skip
    max_connections: int = setting(
        DEFAULT_MAX_CONNECTIONS, "--max-connections",
        help="open connections before new ones are closed", parse=int_in_range(2, 1_000_000),
        metavar="N", **_SERVER,
    )  # fmt: skip
    cors_origins: tuple[str, ...] = setting(  # (): server/cors.py's keyed/keyless defaults
        (), "--cors-origins",
        help="origins allowed cross-origin: a comma list, 'localhost' (any local origin) or "
        "'*'; OPTIONS preflights are answered 200 either way, with "
        "Access-Control-Allow-Origin only for these", parse=cors_origins,
        env="LLAMA_ARG_CORS_ORIGINS", metavar="LIST",
        shown="none without an API key (same-origin only); every origin with a key "
        "(llama-server's)", **_SERVER,
    )  # fmt: skip
    cors_methods: tuple[str, ...] = setting(
        DEFAULT_CORS_METHODS, "--cors-methods", help="methods a preflight allows (comma list)",
        parse=token_list, env="LLAMA_ARG_CORS_METHODS", metavar="LIST",
        shown=", ".join(DEFAULT_CORS_METHODS), **_SERVER,
    )  # fmt: skip
    cors_headers: tuple[str, ...] = setting(  # ("*",): the headers asked for
        DEFAULT_CORS_HEADERS, "--cors-headers",
        help="request headers a preflight allows (comma list; * = the headers it asks for, "
        "but a literal * with an API key and no --cors-origins)",
        parse=token_list, env="LLAMA_ARG_CORS_HEADERS", metavar="LIST", shown="*", **_SERVER,
    )  # fmt: skip
    cors_credentials: bool = setting(
        True, "--cors-credentials",
        help="allow credentials (cookies, Authorization) from the allowed origins",
        env="LLAMA_ARG_CORS_CREDENTIALS", negative=("--no-cors-credentials",), **_SERVER,
    )  # fmt: skip
    allowed_hosts: tuple[str, ...] = setting(  # names served without an API key; ("*",): all
        (), "--allowed-hosts",
        help="host names served without an API key besides IP addresses, localhost and "
        "--host (DNS-rebinding defence: other Host headers get 403); * serves every name",
        parse=host_names, metavar="LIST", shown="none", **_SERVER,
    )  # fmt: skip
    write_timeout_s: float = setting(  # a stalled response write closes
        float(DEFAULT_TIMEOUT_S), "-to", "--timeout",
        help="read/write timeout in seconds (1-86400): the deadline of a request's body "
        "unless --body-timeout is given, and how long a response write may make no progress "
        "before the connection is closed (its generation ends)",
        parse=int_in_range(1, 86400), flag_default=DEFAULT_TIMEOUT_S, to_field=float,
        env="LLAMA_ARG_TIMEOUT", metavar="N", dest="timeout", **_SERVER,
    )  # fmt: skip
    max_connections_per_client: int | None = setting(  # None: half of --max-connections
        None, "--max-connections-per-client",
        help="open connections of one client address; past it the client's oldest idle "
        "connection is closed (or the new one, when none is idle)",
        parse=int_in_range(1, 1_000_000), metavar="N", shown="half of --max-connections",
        **_SERVER,
    )  # fmt: skip
    grammar_deadline_s: float | None = setting(  # None: no deadline
        DEFAULT_GRAMMAR_DEADLINE_S, "--grammar-deadline",
        help="seconds a grammar- or schema-constrained generation may run after its first "
        "token before it is stopped with a 400 grammar_deadline_exceeded (0 = no deadline)",
        parse=deadline_seconds, metavar="S", shown="60", dest="grammar_deadline", **_SERVER,
    )  # fmt: skip
    threads_http: int | None = setting(  # the worker-thread limit of blocking work; None: 40
        None, "--threads-http",
        help="threads that run blocking request work (file reads, tokenizing); -1 or 0 = "
        "automatic (40); the generation has its own engine thread",
        parse=threads_http, flag_default=-1, to_field=_automatic_threads,
        env="LLAMA_ARG_THREADS_HTTP", metavar="N", **_SERVER,
    )  # fmt: skip
