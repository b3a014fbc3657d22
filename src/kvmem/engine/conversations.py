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
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .session import KVMemSession
from .session_persist import initial_window
from .trace import TraceKind, Tracer, TurnStats

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class Conversation:
    conv_id: int
    session: KVMemSession
    first_prompt_tokens: int = 0  # 0 until its first turn
    last_used: float = 0.0
    history: np.ndarray | None = None  # int64 [n]: the full history while inactive

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
        make_session: Callable[[], KVMemSession],
        tracer: Tracer,
    ) -> None:
        self.capacity = capacity
        self._make = make_session
        self._next_id = 1
        self.tracer = tracer
        self.conversations = [Conversation(0, first)]
        self.active: Conversation | None = self.conversations[0]
        self.cost = SwitchCost()
        self.evicted = 0

    def _best(self, prompt: Sequence[int]) -> tuple[Conversation | None, int]:
        best, best_len = None, -1
        for conv in self.conversations:
            shared = conv.shared_prefix(prompt)
            continues = conv.first_prompt_tokens == 0 or shared >= conv.first_prompt_tokens
            if continues and shared > best_len:
                best, best_len = conv, shared
        return best, best_len

    def best_prefix(self, prompt: Sequence[int]) -> int:
        """The longest prefix of `prompt` a conversation continuing it holds (0: none)."""
        return max(0, self._best(prompt)[1])

    def route(self, prompt: Sequence[int]) -> KVMemSession:
        """The session for `prompt`, made active (switching the GPU window if needed)."""
        best, _ = self._best(prompt)
        if best is None:
            best = self._new_conversation()
        self._activate(best)
        best.history = None
        if best.first_prompt_tokens == 0:
            best.first_prompt_tokens = len(prompt)
        best.last_used = time.monotonic()
        return best.session

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
            victim.first_prompt_tokens, victim.history = 0, None
            self.evicted += 1
            logger.info("conversation %d evicted (least recently used)", victim.conv_id)
            self.tracer.emit(TraceKind.CONV_EVICT, conversation=victim.conv_id)
            victim.conv_id, self._next_id = self._next_id, self._next_id + 1
            return victim
        conv = Conversation(self._next_id, self._make())
        self._next_id += 1
        self.conversations.append(conv)
        return conv

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
            restored = s.window.restore_own(initial_window(s.config, n), TurnStats())
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
        conv.history = s.table.token_array().copy()
        keep = s.table.n_complete_blocks * s.table.block_tokens
        dropped = s.table.n_tokens - keep
        s.table.truncate(keep)
        s.ctx.clear()
        s.window.reset()
        return dropped

    def close(self) -> None:
        for conv in self.conversations:
            index = conv.session.index
            close = getattr(index, "close", None)
            if close is not None:
                close()
