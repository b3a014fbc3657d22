"""A one-way channel from the engine worker thread to a request's asyncio task."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class JobStarted:
    """The job left the queue and its prompt was tokenized; generation begins."""

    prompt_tokens: int


@dataclass(slots=True)
class JobFailed:
    """The job ended with an exception (mapped to an HTTP error by the route)."""

    error: BaseException


class EventChannel:
    """Thread-safe producer (`put`, from any thread), async consumer (`get`)."""

    __slots__ = ("_loop", "_queue")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue: asyncio.Queue[Any] = asyncio.Queue()

    def put(self, item: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the event loop is closed: the server is shutting down
            logger.debug("dropping an event for a closed event loop")

    async def get(self) -> Any:
        return await self._queue.get()
