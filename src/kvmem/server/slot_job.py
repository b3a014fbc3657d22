"""`POST /slots/0?action=save|restore|erase` as a job for the engine worker.

It runs on the engine thread between generations (a slot action waits for the running
request, as llama-server defers it while the slot is busy) and yields one `SlotDone`.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from kvmem.engine.persist.slot_file import SlotResult, erase_slot, restore_slot, save_slot
from kvmem.server.channel import EventChannel


class SlotAction(Enum):
    SAVE = "save"
    RESTORE = "restore"
    ERASE = "erase"


@dataclass(slots=True)
class SlotDone:
    result: SlotResult


@dataclass(slots=True)
class SlotJob:
    action: SlotAction
    path: Path | None  # None for erase
    channel: EventChannel
    cancel: threading.Event = field(default_factory=threading.Event)

    def run(self, engine: Any) -> Any:
        if self.action is SlotAction.SAVE:
            assert self.path is not None
            yield SlotDone(save_slot(engine, self.path))
        elif self.action is SlotAction.RESTORE:
            assert self.path is not None
            yield SlotDone(restore_slot(engine, self.path))
        else:
            yield SlotDone(erase_slot(engine))


def new_slot_job(action: SlotAction, path: Path | None) -> SlotJob:
    """A slot job answering on the running event loop (called from a route)."""
    return SlotJob(action, path, EventChannel(asyncio.get_running_loop()))
