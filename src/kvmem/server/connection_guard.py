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
- Connection limit: at most `--max-connections` connections are open. The limit is kept
  below the process's file-descriptor limit (raised to its hard limit at startup), so the
  accept loop never runs out of descriptors.
- Per-client share: one client address holds at most `--max-connections-per-client`
  (default half of `--max-connections`). A connection past a limit first makes room by
  closing an *idle* connection, one that has not sent a complete request since it
  connected or since its previous response: its client's oldest (the share), or the
  oldest of the client holding the most connections (the cap). Only when no idle one is
  left is the new connection closed at once. So 1,000 slow sockets of one client cost
  that client its own oldest sockets: other clients, and that client's own next `/health`,
  are still served, and requests in progress are never cut.
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


def per_client_limit(requested: int | None, max_connections: int) -> int:
    """The per-client share: `requested` (None: half of the cap), at most the cap."""
    share = max_connections // 2 if requested is None else requested
    return max(1, min(share, max_connections))


def _client(transport: Any) -> str:
    peer = transport.get_extra_info("peername")
    return str(peer[0]) if isinstance(peer, (tuple, list)) and peer else ""


def guarded_protocol(
    header_timeout_s: float,
    max_connections: int,
    write_timeout_s: float | None = None,
    per_client: int | None = None,
) -> type[H11Protocol]:
    """An H11Protocol subclass with these bounds (uvicorn instantiates it per connection)."""
    share = per_client_limit(per_client, max_connections)
    clients: dict[str, dict[Any, None]] = {}  # client address -> its connections, oldest first

    class GuardedH11Protocol(H11Protocol):
        _last_refusal_log = 0.0
        _write_timer: Any = None
        _client_key: str | None = None
        _waiting_after: Any = None

        @property
        def idle(self) -> bool:
            """No request in progress: nothing since connecting or since the last response."""
            return self.cycle is self._waiting_after and not self.transport.is_closing()

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
            key = _client(transport)
            mine = clients.get(key, {})
            if len(mine) >= share and not self._evict(mine):
                self._refuse("this client's share (%d, --max-connections-per-client)", share)
                return
            if len(self.connections) > max_connections:
                largest = max(clients.values(), key=len, default={})
                if not self._evict(largest):
                    self._refuse("the connection limit (%d, --max-connections)", max_connections)
                    return
            clients.setdefault(key, {})[self] = None
            self._client_key = key
            self._arm_header_timer()

        @staticmethod
        def _evict(held: dict[Any, None]) -> bool:
            """Close the oldest idle connection of `held`; False when none is idle."""
            for other in held:
                if other.idle:
                    logger.debug("closing an idle connection to make room for a new one")
                    other._forget()
                    other.transport.close()
                    return True
            return False

        def _refuse(self, reason: str, limit: int) -> None:
            now = time.monotonic()
            if now - GuardedH11Protocol._last_refusal_log > 10.0:
                GuardedH11Protocol._last_refusal_log = now
                logger.warning("closing new connections: %s is held by busy ones", reason % limit)
            self.transport.close()

        def _forget(self) -> None:
            if self._client_key is not None:
                held = clients.get(self._client_key, {})
                held.pop(self, None)
                if not held:
                    clients.pop(self._client_key, None)
                self._client_key = None

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm_header_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._forget()
            self._cancel_write_timer()
            timer = getattr(self, "_header_timer", None)
            if timer is not None:
                timer.cancel()
            super().connection_lost(exc)

        def _arm_header_timer(self) -> None:
            timer = getattr(self, "_header_timer", None)
            if timer is not None:
                timer.cancel()
            waiting_after = self._waiting_after = self.cycle
            self._header_timer = self.loop.call_later(
                header_timeout_s, self._header_timeout, waiting_after
            )

        def _header_timeout(self, waiting_after: Any) -> None:
            if self.cycle is waiting_after and not self.transport.is_closing():
                logger.debug("closing a connection that sent no complete request headers")
                self.transport.close()

    return GuardedH11Protocol
