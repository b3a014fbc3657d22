"""A client that leaves is noticed within the poll interval even while events keep coming
(the generation of a non-stream request must not run on for thousands of tokens)."""

from __future__ import annotations

import asyncio

from kvmem.server import disconnect


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now


class _Request:
    def __init__(self) -> None:
        self.scope: dict = {}
        self.gone = False
        self.asked = 0

    async def is_disconnected(self) -> bool:
        self.asked += 1
        return self.gone


class _Busy:
    """A channel with an event always ready (a fast generation)."""

    async def get(self) -> str:
        return "token"


def test_events_flow_until_the_poll_interval_then_the_client_is_asked(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(disconnect.time, "monotonic", clock.monotonic)
    request, channel = _Request(), _Busy()

    async def run() -> list[tuple[bool, object]]:
        out = [await disconnect.next_or_disconnect(request, channel)]  # t = 100.0
        request.gone = True  # the client leaves; events keep coming
        for step in (0.1, 0.1, 0.1):
            clock.now += step
            out.append(await disconnect.next_or_disconnect(request, channel))
        return out

    results = asyncio.run(run())
    # asked only once 0.25 s passed since the first call (at t = 100.3), not per event
    assert results == [(True, "token"), (True, "token"), (True, "token"), (False, None)]
    assert request.asked == 1
