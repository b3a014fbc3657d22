"""The generation loop behind kvmem-cli: one-shot or interactive, chat-formatted or raw."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from kvmem.chat.detokenize import IncrementalDetokenizer
from kvmem.chat.prompt import build_prompt_tokens
from kvmem.chat.template import ChatTemplate
from kvmem.engine import Engine, EngineSettings
from kvmem.errors import ConfigError
from kvmem.memory.spans import TokenSpan
from kvmem.sampling import SamplingParams


class ChatRunner:
    """Owns the engine for one kvmem-cli invocation."""

    def __init__(self, ns: argparse.Namespace, settings: EngineSettings) -> None:
        self.ns = ns
        self.engine = Engine(settings)
        self.template = None if ns.raw else ChatTemplate.from_engine_info(self.engine.info)
        self.messages: list[dict[str, Any]] = []
        self.raw_history: list[int] = []  # raw mode: prompt and output tokens so far
        if ns.system_prompt:
            self.messages.append({"role": "system", "content": ns.system_prompt})
        self.sampling = SamplingParams(
            temperature=ns.temp,
            top_k=ns.top_k,
            top_p=ns.top_p,
            min_p=ns.min_p,
            repeat_penalty=ns.repeat_penalty,
            seed=ns.seed,
        )

    def run(self) -> int:
        if self.ns.interactive:
            return self._interactive()
        text = self._initial_prompt()
        if text is None:
            raise ConfigError("-p", "give a prompt with -p or -f, or use -i for a chat")
        self._turn(text)
        return 0

    def _initial_prompt(self) -> str | None:
        if self.ns.file is not None:
            with open(self.ns.file, encoding="utf-8") as f:
                return f.read()
        return self.ns.prompt

    def _interactive(self) -> int:
        first = self._initial_prompt()
        if first:
            self._turn(first)
        while True:
            try:
                line = input("> ")
            except EOFError:
                print()
                return 0
            if line.strip() in ("/exit", "/quit"):
                return 0
            if line.strip():
                self._turn(line)

    def _turn(self, text: str) -> str:
        tokens, query = self._prompt_tokens(text)
        detok = IncrementalDetokenizer(self.engine)
        out: list[str] = []
        for token in self.engine.generate(
            tokens,
            query=query,
            sampling=self.sampling,
            max_tokens=self.ns.n_predict,
            ignore_eos=self.ns.ignore_eos,
        ):
            self.raw_history.append(token)
            piece = detok.push(token)
            out.append(piece)
            sys.stdout.write(piece)
            sys.stdout.flush()
        tail = detok.flush()
        out.append(tail)
        sys.stdout.write(tail + "\n")
        sys.stdout.flush()
        answer = "".join(out)
        if self.template is not None:
            self.messages.append({"role": "assistant", "content": answer})
        return answer

    def _prompt_tokens(self, text: str) -> tuple[list[int], TokenSpan | None]:
        if self.template is None:
            start = len(self.raw_history)
            self.raw_history += self.engine.tokenize(text, add_special=start == 0)
            return list(self.raw_history), TokenSpan(start, len(self.raw_history))
        self.messages.append({"role": "user", "content": text})
        prompt = build_prompt_tokens(self.engine, self.template, self.messages)
        return prompt.tokens, prompt.query

    def close(self) -> None:
        self.engine.close()
