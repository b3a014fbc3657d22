"""The next event of a job, or None once its client has gone away.

The client is asked at least every `DISCONNECT_POLL_S` seconds, also while events keep
arriving: a generation that produces a token every few milliseconds must still notice a
client that left (llama.cpp's test_cancel_request: a 0.1 s client timeout, `n_predict: -1`,
the slot free 2 s later).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Protocol

from starlette.requests import Request

DISCONNECT_POLL_S = 0.25


class _Channel(Protocol):
    async def get(self) -> Any: ...


async def next_or_disconnect(request: Request, channel: _Channel) -> tuple[bool, Any]:
    """(True, event), or (False, None) when the client disconnected."""
    state = request.scope.setdefault("kvmem.disconnect_checked", [time.monotonic()])
    while True:
        try:
            event = await asyncio.wait_for(channel.get(), timeout=DISCONNECT_POLL_S)
        except asyncio.TimeoutError:
            event, timed_out = None, True
        else:
            timed_out = False
        now = time.monotonic()
        if timed_out or now - state[0] >= DISCONNECT_POLL_S:
            state[0] = now
            if await request.is_disconnected():
                return False, None
        if not timed_out:
            return True, event
