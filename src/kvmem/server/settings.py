"""The resolved kvmem-server configuration. The record is built by the flag layer
(`kvmem.cli.server_settings`), which must not import the server; it is re-exported here
for the server's modules."""

from __future__ import annotations

from kvmem.cli.server_settings import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    DEFAULT_QUEUE_SIZE,
    ServerSettings,
    Source,
)

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "DEFAULT_QUEUE_SIZE", "ServerSettings", "Source"]
