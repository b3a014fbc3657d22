"""Small fakes of the engine for the benchmark logic: a character tokenizer and engines
that "see" either the whole prompt or only a window of it."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np

from kvmem.bench.engines import Method
from kvmem.memory.spans import PromptSpans, TokenSpan

SPECIALS = {"<|im_start|>": 1, "<|im_end|>": 2}
N_VOCAB = 256


class CharTokenizer:
    """One token per character (its code point, < 256 here); ChatML markers are 1 and 2."""

    def tokenize(
        self, text: str, *, add_special: bool = False, parse_special: bool = True
    ) -> list[int]:
        if not parse_special:
            return [ord(c) for c in text]
        out: list[int] = []
        for part in re.split(r"(<\|im_start\|>|<\|im_end\|>)", text):
            if part in SPECIALS:
                out.append(SPECIALS[part])
            else:
                out += [ord(c) for c in part]
        return out

    def detokenize(self, tokens: Sequence[int]) -> str:
        names = {v: k for k, v in SPECIALS.items()}
        return "".join(names.get(t, chr(t)) for t in tokens)


AnswerFn = Callable[[str, str], str]  # (visible text, query text) -> answer


def passkey_answer(visible: str, query: str) -> str:
    """Answer a pass-key question from the visible text, like a perfect reader."""
    vault = re.search(r"for the (\w+) vault", query)
    if vault:
        found = re.search(rf"pass key for the {vault.group(1)} vault is (\d+)", visible)
    else:
        found = re.search(r"The pass key is (\d+)", visible)
    return f" {found.group(1)}." if found else " I do not know."


@dataclass
class FakeEngine:
    """Sees the first `sink` and the last `window` prompt tokens (window=None: all)."""

    method: Method
    answer_fn: AnswerFn = passkey_answer
    window: int | None = None
    sink: int = 0
    ref_logits: Callable[[Sequence[int], Sequence[int]], np.ndarray] | None = None
    info: Any = field(
        default_factory=lambda: SimpleNamespace(
            n_vocab=N_VOCAB, bos_token_id=0, add_bos=False, name="fake"
        )
    )
    session: Any = field(
        default_factory=lambda: SimpleNamespace(
            last_query=None, index=None, store=None, last_plan=None
        )
    )
    last_turn: Any = None
    history: list[int] = field(default_factory=list)
    prompts: list[list[int]] = field(default_factory=list)
    closed: bool = False
    resets: int = 0
    _tok: CharTokenizer = field(default_factory=CharTokenizer)

    def tokenize(
        self, text: str, *, add_special: bool = False, parse_special: bool = True
    ) -> list[int]:
        return self._tok.tokenize(text, parse_special=parse_special)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self._tok.detokenize(tokens)

    def visible(self, prompt: Sequence[int]) -> list[int]:
        if self.window is None or len(prompt) <= self.sink + self.window:
            return list(prompt)
        return list(prompt[: self.sink]) + list(prompt[len(prompt) - self.window :])

    def _turn(self, prompt: Sequence[int], generated: int) -> None:
        cached = 0
        for a, b in zip(self.history, prompt, strict=False):
            if a != b:
                break
            cached += 1
        cached = min(cached, len(prompt) - 1)
        self.last_turn = SimpleNamespace(
            prompt_tokens=len(prompt),
            cached_tokens=cached,
            prefill_tokens=len(prompt) - cached,
            prefill_ms=float(len(prompt) - cached),
            generated_tokens=generated,
            decode_ms=2.0 * generated,
            stage_in_blocks=0,
            replayed_tokens=0,
            finish_reason="stop",
        )

    def generate(
        self,
        prompt: Sequence[int],
        *,
        query: PromptSpans | TokenSpan | None = None,
        sampling: Any = None,
        max_tokens: int = -1,
    ) -> Iterator[int]:
        self.prompts.append(list(prompt))
        query = PromptSpans.of(query).query
        text = self.detokenize(self.visible(prompt))
        query_text = self.detokenize(prompt[query.start : query.end]) if query else ""
        answer = self.tokenize(self.answer_fn(text, query_text), parse_special=False)
        if max_tokens >= 0:
            answer = answer[:max_tokens]
        self._turn(prompt, len(answer))
        self.history = list(prompt) + answer
        yield from answer

    def teacher_force(
        self, prompt: Sequence[int], continuation: Sequence[int], *, query: TokenSpan | None = None
    ) -> np.ndarray:
        assert self.ref_logits is not None
        self.prompts.append(list(prompt))
        self._turn(prompt, len(continuation))
        self.history = list(prompt) + list(continuation)
        return self.ref_logits(prompt, continuation)

    def reset(self) -> None:
        self.resets += 1
        self.history = []

    def close(self) -> None:
        self.closed = True


@dataclass
class FakeFactory:
    """Opens a FakeEngine per method; `window_of` gives the window each method sees."""

    window_of: dict[Method, int | None]
    sink: int = 0
    answer_fn: AnswerFn = passkey_answer
    ref_logits: dict[Method, Callable[[Sequence[int], Sequence[int]], np.ndarray]] = field(
        default_factory=dict
    )
    opened: list[FakeEngine] = field(default_factory=list)

    def open(self, method: Method) -> FakeEngine:
        engine = FakeEngine(
            method,
            self.answer_fn,
            self.window_of.get(method),
            self.sink,
            self.ref_logits.get(method),
        )
        self.opened.append(engine)
        return engine
