"""`DELETE /kvmem/conversations/{id}` as a job for the engine worker.

It runs on the thread of the lane holding the conversation, between generations (a turn
running on that lane finishes first), and yields one `ConversationDone`.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any

from kvmem.server.channel import EventChannel


@dataclass(slots=True)
class ConversationDone:
    freed_bytes: int | None  # None: no lane held the conversation


@dataclass(slots=True)
class ConversationJob:
    conversation_id: str
    channel: EventChannel
    cancel: threading.Event = field(default_factory=threading.Event)

    def run(self, engine: Any) -> Any:
        drop = getattr(engine, "drop_conversation", None)
        yield ConversationDone(drop(self.conversation_id) if drop is not None else None)


def new_conversation_job(conversation_id: str) -> ConversationJob:
    """A delete job answering on the running event loop (called from a route)."""
    return ConversationJob(conversation_id, EventChannel(asyncio.get_running_loop()))
