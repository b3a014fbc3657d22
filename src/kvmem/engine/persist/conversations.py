"""Several warm conversations on one context (`--kvmem-conversations N`).

Each conversation is its own `KVMemSession` (block table, host store, retrieval index,
window) on the shared llama.cpp context; one of them is active (holds the GPU window).
A request goes to the conversation whose history shares the longest token prefix with
it, provided the prefix covers that conversation's first prompt (its system prompt and
first user message): a new conversation that only shares the system prompt gets a
session of its own, evicting the least recently used one past N.

Switching swaps the GPU window: the old conversation's complete blocks are all in its
host store already, so its cells are cleared and its open (partial) block's tokens are
dropped from its history (they are processed again when it comes back); the new one's
sink and most recent blocks that fit the budget are restored. A conversation's tokens
exist only in its own session, so none can enter another's window.

With `--kvmem-disk-dir` every slot has its own store and manifest (conversation_disk.py):
the active conversation is checkpointed after each turn, and at start the stored
conversations are loaded, inactive, to be routed to by prefix. `--kvmem-conversations-mib`
caps the stored blocks of all conversations: past it, after a turn, the least recently
used conversations other than the active one are evicted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..session.session import KVMemSession
from ..trace import TraceKind, Tracer
from .conversation_disk import ConversationDisk
from .session_persist import SessionPersister, initial_window

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class Conversation:
    conv_id: int
    session: KVMemSession
    first_prompt_tokens: int = 0  # 0 until its first turn
    last_used: float = 0.0  # time.time() of its last turn (persisted: the LRU order)
    history: np.ndarray | None = None  # int64 [n]: the full history while inactive
    slot: int = 0  # its place in the pool (DIR/conversation-<slot> with a disk dir)
    persister: SessionPersister | None = None
    name: str | None = None  # the client's conversation id (`kvmem.conversation_id`)

    def shared_prefix(self, prompt: Sequence[int]) -> int:
        if self.history is None:
            return self.session.table.common_prefix(prompt)
        other = np.asarray(prompt, dtype=np.int64)  # [n_prompt]
        m = min(other.shape[0], self.history.shape[0])
        differ = np.flatnonzero(other[:m] != self.history[:m])  # [n_diff]
        return int(differ[0]) if differ.shape[0] else m


@dataclass(slots=True)
class SwitchCost:
    switches: int = 0
    ms: float = 0.0
    restored_blocks: int = 0
    dropped_tail_tokens: int = 0


class ConversationPool:
    """Routes prompts to sessions and swaps the GPU window between them."""

    def __init__(
        self,
        capacity: int,
        first: KVMemSession,
        make_session: Callable[[int], KVMemSession],
        tracer: Tracer,
        *,
        disk: ConversationDisk | None = None,
        cap_bytes: int = 0,
    ) -> None:
        self.capacity = capacity
        self._make = make_session
        self._next_id = 1
        self.tracer = tracer
        self.disk = disk
        self.cap_bytes = cap_bytes
        self.conversations = [Conversation(0, first)]
        self.active: Conversation | None = self.conversations[0]
        self.cost = SwitchCost()
        self.evicted = 0
        if disk is not None:
            self._load_stored(disk)

    def _load_stored(self, disk: ConversationDisk) -> None:
        """Every slot gets its session now; the stored ones are loaded, left inactive."""
        for slot in range(1, self.capacity):
            self.conversations.append(Conversation(slot, self._make(slot), slot=slot))
        self._next_id = self.capacity
        for conv in self.conversations:
            conv.persister = disk.persister(conv.session)
            stored = disk.load(conv.persister)
            if stored is not None:
                conv.first_prompt_tokens = stored.first_prompt_tokens
                conv.last_used = stored.last_used
                self._deactivate(conv)  # the load restored its window: off the GPU again
        self.active = None
        found = [c.conv_id for c in self.conversations if c.first_prompt_tokens]
        logger.info("conversations found in %s: %s", disk.root, found or "none")

    def _best(
        self, prompt: Sequence[int], name: str | None = None
    ) -> tuple[Conversation | None, int]:
        """The conversation continuing `prompt` and its shared prefix. A named request goes
        to its own conversation only (None: a new one); an unnamed one never enters a
        named conversation."""
        if name is not None:
            conv = self.named(name)
            return conv, (conv.shared_prefix(prompt) if conv is not None else -1)
        best, best_len = None, -1
        for conv in self.conversations:
            if conv.name is not None:
                continue
            shared = conv.shared_prefix(prompt)
            continues = conv.first_prompt_tokens == 0 or shared >= conv.first_prompt_tokens
            if continues and shared > best_len:
                best, best_len = conv, shared
        return best, best_len

    def best_prefix(self, prompt: Sequence[int]) -> int:
        """The longest prefix of `prompt` a conversation continuing it holds (0: none)."""
        return max(0, self._best(prompt)[1])

    def named(self, name: str) -> Conversation | None:
        """The conversation the client calls `name` (None: unknown or evicted)."""
        return next((c for c in self.conversations if c.name == name), None)

    def route(self, prompt: Sequence[int], name: str | None = None) -> KVMemSession:
        """The session for `prompt` (with `name`, that conversation's), made active
        (switching the GPU window if needed)."""
        best, _ = self._best(prompt, name)
        if best is None:
            best = self._new_conversation()
            best.name = name
        self._activate(best)
        best.history = None
        if best.first_prompt_tokens == 0:
            best.first_prompt_tokens = len(prompt)
        best.last_used = time.time()
        return best.session

    def persist(self) -> None:
        """Checkpoint the active conversation (with a disk dir)."""
        conv = self.active
        if conv is None or conv.persister is None:
            return
        conv.persister.extra = {
            "first_prompt_tokens": conv.first_prompt_tokens,
            "last_used": conv.last_used,
        }
        conv.persister.persist()
        conv.persister.emit_tier()

    @property
    def stored_bytes(self) -> int:
        return sum(c.session.store.nbytes for c in self.conversations)

    def enforce_cap(self) -> list[int]:
        """Past --kvmem-conversations-mib, evict the least recently used conversations
        (never the active one); returns the evicted conversations' ids."""
        evicted: list[int] = []
        while self.cap_bytes and self.stored_bytes > self.cap_bytes:
            idle = [c for c in self.conversations if c is not self.active and c.first_prompt_tokens]
            if not idle:
                break
            victim = min(idle, key=lambda c: c.last_used)
            evicted.append(victim.conv_id)
            self._forget_inactive(victim, "past --kvmem-conversations-mib")
        return evicted

    def _forget_inactive(self, conv: Conversation, why: str) -> None:
        """Drop an inactive conversation (its cells are not in the context; nothing
        touches the context, which holds the active one's)."""
        _clear_inactive(conv.session)
        self._note_evicted(conv, why)

    def drop(self, conv: Conversation) -> int:
        """Forget `conv` at the client's request (DELETE): its history, host blocks and
        stored manifest go; the slot is free for a new conversation. Returns the host
        bytes freed."""
        before = conv.session.store.nbytes
        if conv is self.active:
            conv.session.reset()  # the context holds this conversation's cells only
        else:
            _clear_inactive(conv.session)
        conv.first_prompt_tokens, conv.history, conv.name = 0, None, None
        logger.info("conversation %d deleted by the client", conv.conv_id)
        if conv.persister is not None:
            conv.persister.extra = {}
            conv.persister.persist()  # an empty manifest: not found again after a restart
        return before - conv.session.store.nbytes

    def _new_conversation(self) -> Conversation:
        fresh = [c for c in self.conversations if c.first_prompt_tokens == 0]
        if fresh:
            return fresh[0]
        if len(self.conversations) >= self.capacity:
            victim = min(self.conversations, key=lambda c: c.last_used)
            if self.active is not None:
                self._deactivate(self.active)
                self.active = None
            victim.session.reset()  # the context holds no session's cells now
            self._note_evicted(victim, f"past {self.capacity} conversations")
            return victim
        conv = Conversation(self._next_id, self._make(len(self.conversations)))
        conv.slot = len(self.conversations)
        self._next_id += 1
        self.conversations.append(conv)
        return conv

    def _note_evicted(self, victim: Conversation, why: str) -> None:
        victim.first_prompt_tokens, victim.history, victim.name = 0, None, None
        self.evicted += 1
        logger.info("conversation %d evicted (least recently used, %s)", victim.conv_id, why)
        self.tracer.emit(TraceKind.CONV_EVICT, conversation=victim.conv_id)
        if victim.persister is not None:
            victim.persister.extra = {}
            victim.persister.persist()  # an empty manifest: not found again after a restart
        victim.conv_id, self._next_id = self._next_id, self._next_id + 1

    def _activate(self, conv: Conversation) -> None:
        if conv is self.active:
            return
        t0 = time.perf_counter()
        old = self.active
        dropped = self._deactivate(old) if old is not None else 0
        s = conv.session
        restored = 0
        n = s.table.n_complete_blocks
        if n:
            restored = s.window.restore_own(initial_window(s.config, n)).stage_in_blocks
        s.window.last_plan = None
        s.window.note_peak()
        self.active = conv
        ms = (time.perf_counter() - t0) * 1e3
        self.cost.switches += 1
        self.cost.ms += ms
        self.cost.restored_blocks += restored
        self.cost.dropped_tail_tokens += dropped
        self.tracer.emit(
            TraceKind.SWITCH,
            from_conv="-" if old is None else old.conv_id,
            to_conv=conv.conv_id,
            restored=restored,
            dropped_tail=dropped,
            ms=ms,
        )

    def _deactivate(self, conv: Conversation) -> int:
        """Take `conv` off the GPU; returns the open-block tokens dropped from its history."""
        s = conv.session
        s.window.flush()  # its complete blocks in the host store before the cells go
        conv.history = s.table.token_array().copy()
        keep = s.table.n_complete_blocks * s.table.block_tokens
        dropped = s.table.n_tokens - keep
        s.table.truncate(keep)
        s.rows.truncate(keep)
        s.ctx.clear()
        s.window.reset()
        return dropped

    def close(self) -> None:
        for conv in self.conversations:
            index = conv.session.index
            close = getattr(index, "close", None)
            if close is not None:
                close()
            conv.session.transfer.close()
        if self.disk is not None:
            self.disk.close()


def _clear_inactive(s: KVMemSession) -> None:
    """Empty a session whose cells are not in the context (the context is left alone)."""
    s.window.reset()
    s.table.truncate(0)
    s.store.drop(s.store.block_ids())
    if s.index is not None:
        s.index.remove(s.index.block_ids())
    s.last_query, s.frontier = None, None
    s.rows.clear()
