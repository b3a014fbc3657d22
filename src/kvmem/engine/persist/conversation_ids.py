"""Conversations a client names (`"kvmem": {"conversation_id": ...}` in a request).

A named request goes to its own conversation, not to the one sharing the longest prefix:
with `--kvmem-conversations N` each id is one conversation of the pool (a new id takes a
fresh slot, evicting the least recently used past N; an unnamed request never enters a
named conversation); without a pool the engine's one session belongs to the last id that
used it, and a request with another id, or none, takes its place. The server looks an id
up (`describe`) and deletes it (`drop`: its history and host blocks go, so the store's
byte count drops). Ids live in memory: after a restart a stored conversation is found
again by its prefix, not by its id.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from ..session.session import KVMemSession
from .conversations import ConversationPool


@dataclass(frozen=True, slots=True)
class ConversationSummary:
    """One named conversation as `GET /kvmem/conversations/{id}` shows it."""

    conversation_id: str
    tokens: int  # its history (prompt and generated tokens kept)
    host_bytes: int  # its blocks in the host store
    host_blocks: int
    active: bool  # holds the GPU window now
    last_used: float  # time.time() of its last turn


class ConversationIds:
    """The client-named conversations of one engine (lane)."""

    def __init__(self, pool: ConversationPool | None) -> None:
        self.pool = pool
        self.owner: str | None = None  # without a pool: the id holding the one session
        self.owner_used = 0.0

    def route(self, prompt: Sequence[int], name: str | None, current: KVMemSession) -> KVMemSession:
        """The session a turn on `prompt` (named `name`, or None) runs on."""
        if self.pool is not None:
            return self.pool.route(prompt, name)
        self.owner, self.owner_used = name, time.time()
        return current

    def holds(self, name: str) -> bool:
        if self.pool is not None:
            return self.pool.named(name) is not None
        return self.owner == name

    def describe(self, name: str, current: KVMemSession) -> ConversationSummary | None:
        """The conversation `name` (None: this engine does not hold it)."""
        if self.pool is not None:
            conv = self.pool.named(name)
            if conv is None:
                return None
            s = conv.session
            tokens = s.table.n_tokens if conv.history is None else int(conv.history.shape[0])
            active, used = conv is self.pool.active, conv.last_used
        elif self.owner == name:
            s, tokens, active, used = current, current.table.n_tokens, True, self.owner_used
        else:
            return None
        return ConversationSummary(name, tokens, s.store.nbytes, len(s.store), active, used)

    def drop(self, name: str, current: KVMemSession) -> int | None:
        """Forget `name`; the host bytes freed (None: this engine does not hold it)."""
        if self.pool is not None:
            conv = self.pool.named(name)
            return None if conv is None else self.pool.drop(conv)
        if self.owner != name:
            return None
        before = current.store.nbytes
        current.reset()
        self.owner = None
        return before - current.store.nbytes
