"""The HTTP/1.1 protocol kvmem-server runs: uvicorn's h11 protocol with two more bounds.

- Header timeout: a connection must deliver a request's complete headers within
  `--header-timeout` seconds of connecting (or of its previous response); otherwise it
  is closed. uvicorn's own keep-alive timer stops at the first byte, so without this a
  client trickling headers at 1 byte/s holds its connection (and a file descriptor)
  forever.
- Write timeout (`-to/--timeout`, llama-server's write timeout): when the client stops
  reading and the socket's buffer stays full for that many seconds, the connection is
  aborted; the app then sees the disconnect and ends the generation, so a stalled reader
  cannot hold a lane forever.
- Connection limit: past `--max-connections` open connections, new ones are closed at
  once. The limit is kept below the process's file-descriptor limit (raised to its hard
  limit at startup), so the accept loop never runs out of descriptors.
"""

from __future__ import annotations

import logging
import resource
import time
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

logger = logging.getLogger(__name__)

FD_RESERVE = 64  # descriptors kept for the model, logs, sockets of the engine


def raise_fd_limit() -> int:
    """Raise RLIMIT_NOFILE's soft limit to the hard limit; the resulting soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft


def effective_connection_limit(requested: int, fd_limit: int) -> int:
    return max(1, min(requested, fd_limit - FD_RESERVE))


def guarded_protocol(
    header_timeout_s: float, max_connections: int, write_timeout_s: float | None = None
) -> type[H11Protocol]:
    """An H11Protocol subclass with these bounds (uvicorn instantiates it per connection)."""

    class GuardedH11Protocol(H11Protocol):
        _last_refusal_log = 0.0
        _write_timer: Any = None

        def pause_writing(self) -> None:
            super().pause_writing()
            if write_timeout_s is not None and self._write_timer is None:
                self._write_timer = self.loop.call_later(write_timeout_s, self._write_stalled)

        def resume_writing(self) -> None:
            self._cancel_write_timer()
            super().resume_writing()

        def _cancel_write_timer(self) -> None:
            if self._write_timer is not None:
                self._write_timer.cancel()
                self._write_timer = None

        def _write_stalled(self) -> None:
            self._write_timer = None
            if self.flow.write_paused:
                logger.info(
                    "closing a connection whose client read nothing for %g s (--timeout)",
                    write_timeout_s,
                )
                self.transport.abort()

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                now = time.monotonic()
                if now - GuardedH11Protocol._last_refusal_log > 10.0:
                    GuardedH11Protocol._last_refusal_log = now
                    logger.warning(
                        "connection limit reached (%d, --max-connections): closing new connections",
                        max_connections,
                    )
                transport.close()
                return
            self._arm_header_timer()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm_header_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_write_timer()
            timer = getattr(self, "_header_timer", None)
            if timer is not None:
                timer.cancel()
            super().connection_lost(exc)

        def _arm_header_timer(self) -> None:
            timer = getattr(self, "_header_timer", None)
            if timer is not None:
                timer.cancel()
            waiting_after = self.cycle
            self._header_timer = self.loop.call_later(
                header_timeout_s, self._header_timeout, waiting_after
            )

        def _header_timeout(self, waiting_after: Any) -> None:
            if self.cycle is waiting_after and not self.transport.is_closing():
                logger.debug("closing a connection that sent no complete request headers")
                self.transport.close()

    return GuardedH11Protocol
