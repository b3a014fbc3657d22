"""Resource bounds of kvmem-server; the record and its flag parsers live with the flags
(`kvmem.cli.limit_flags`), so that the flag layer never imports the server."""

from __future__ import annotations

from kvmem.cli.limit_flags import (
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_HEADER_TIMEOUT_S,
    DEFAULT_KEEP_ALIVE_TIMEOUT_S,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_CONNECTIONS,
    ServerLimits,
    byte_size,
    cors_origins,
    seconds,
)

__all__ = [
    "DEFAULT_BODY_TIMEOUT_S",
    "DEFAULT_HEADER_TIMEOUT_S",
    "DEFAULT_KEEP_ALIVE_TIMEOUT_S",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_CONNECTIONS",
    "ServerLimits",
    "byte_size",
    "cors_origins",
    "seconds",
]
