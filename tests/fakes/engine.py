"""A scripted fake of `kvmem.engine.engine.Engine` for unit tests of the chat layer and the server.

One token per character (token id = code point), so texts and token counts are easy to
state exactly. Each `generate` call takes the next scripted reply (or asks a callable with
the prompt text), records what it was asked, and reports the reused prefix like the real
session does (longest common prefix with its history).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvmem.chat.template import CHATML_TEMPLATE
from kvmem.errors import InvalidRequestError


@dataclass(frozen=True)
class FakeInfo:
    path: str = "/models/fake-model.gguf"
    name: str = "fake-model"
    n_ctx: int = 4096
    n_ctx_train: int = 8192
    n_vocab: int = 0x110000
    chat_template: str | None = CHATML_TEMPLATE
    bos_token_id: int = 0x2402  # "␂"
    eos_token_id: int = 0x2403
    bos_text: str = "␂"
    eos_text: str = "<|im_end|>"
    add_bos: bool = False


@dataclass
class FakeTurnStats:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    prefill_tokens: int = 0
    prefill_ms: float = 0.0
    generated_tokens: int = 0
    decode_ms: float = 0.0
    finish_reason: str = "stop"
    replayed_tokens: int = 0
    stage_in_blocks: int = 0
    harvested_blocks: int = 0
    truncated_tokens: int = 0
    reselect_ms: float = 0.0


@dataclass
class FakeStats:
    turns: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    stage_in_bytes: int = 0
    harvested_bytes: int = 0
    stage_in_blocks: int = 0
    harvested_blocks: int = 0
    reselect_ms: float = 0.0
    replayed_tokens: int = 0
    spilled_blocks: int = 0
    host_store_bytes: int = 0
    host_blocks: int = 0
    gpu_cells_used: int = 0
    gpu_cells_max: int = 1024


@dataclass
class GenerateCall:
    prompt: str
    query: Any
    sampling: Any
    max_tokens: int
    grammar: str | None
    ignore_eos: bool = False


@dataclass
class FakeEngine:
    replies: list[str] | Callable[[str], str] = field(default_factory=list)
    info: FakeInfo = field(default_factory=FakeInfo)
    token_delay_s: float = 0.0
    calls: list[GenerateCall] = field(default_factory=list)
    history: list[int] = field(default_factory=list)
    last_turn: FakeTurnStats = field(default_factory=FakeTurnStats)
    stats: FakeStats = field(default_factory=FakeStats)
    closed: bool = False
    started: threading.Event = field(default_factory=threading.Event)

    def tokenize(
        self, text: str, *, add_special: bool = False, parse_special: bool = True
    ) -> list[int]:
        head = [self.info.bos_token_id] if add_special and self.info.add_bos else []
        return head + [ord(c) for c in text]

    def check_grammar(self, grammar: str) -> None:
        """Like llama.cpp's parser for the one thing tests need: a grammar has a root rule."""
        if "root ::=" not in grammar:
            raise InvalidRequestError("the grammar could not be parsed", param="grammar")

    def detokenize(self, tokens: Sequence[int]) -> str:
        return "".join(chr(t) for t in tokens)

    def token_bytes(self, token: int) -> bytes:
        return chr(token).encode("utf-8")

    def is_eog(self, token: int) -> bool:
        return False

    def tier_gauges(self) -> dict[str, int]:
        return {}  # no disk tier

    def generate(
        self,
        prompt: Sequence[int],
        *,
        query: Any = None,
        sampling: Any = None,
        max_tokens: int = -1,
        grammar: str | None = None,
        cancel: threading.Event | None = None,
        logits_out: Any = None,
        ignore_eos: bool = False,
        banned_tokens: Sequence[int] = (),
    ) -> Iterator[int]:
        text = self.detokenize(prompt)
        self.calls.append(GenerateCall(text, query, sampling, max_tokens, grammar, ignore_eos))
        reply = (
            self.replies(text)
            if callable(self.replies)
            else (self.replies.pop(0) if self.replies else "")
        )
        cached = 0
        for a, b in zip(self.history, prompt, strict=False):
            if a != b:
                break
            cached += 1
        self.history = list(prompt)
        self.last_turn = FakeTurnStats(
            len(prompt), cached, len(prompt) - cached, 1.0 * (len(prompt) - cached)
        )
        self.stats.turns += 1
        self.stats.prompt_tokens += len(prompt)
        self.started.set()
        finish = "stop"
        try:
            for ch in reply:
                if cancel is not None and cancel.is_set():
                    finish = "cancelled"
                    return
                if self.token_delay_s:
                    time.sleep(self.token_delay_s)
                self.history.append(ord(ch))  # the session holds every yielded token
                self.last_turn.generated_tokens += 1
                finish = "cancelled"
                yield ord(ch)
                finish = "stop"
                if self.last_turn.generated_tokens == max_tokens:
                    finish = "length"
                    return
        finally:
            self.last_turn.finish_reason = finish
            self.last_turn.decode_ms = 2.0 * self.last_turn.generated_tokens
            self.stats.generated_tokens += self.last_turn.generated_tokens

    def reset(self) -> None:
        self.history = []

    def close(self) -> None:
        self.closed = True
