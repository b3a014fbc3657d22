"""The generation loop behind kvmem-cli: one-shot or interactive, chat-formatted or raw."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from kvmem.chat.detokenize import IncrementalDetokenizer
from kvmem.chat.prompt import build_prompt_tokens
from kvmem.chat.template import ChatTemplate
from kvmem.engine.engine import Engine
from kvmem.engine.settings import EngineSettings
from kvmem.errors import ConfigError, TurnCancelledError
from kvmem.memory.spans import TokenSpan
from kvmem.sampling import SamplingParams

HELP = """commands:
  /help          this list
  /reset         forget the conversation (and its KV history)
  /exit, /quit   leave (or Ctrl-D)
Ctrl-C while a reply is written stops that reply; the conversation goes on."""


class _LineStart:
    """The trace's stream in a chat: a record starts on a line of its own, not glued to
    the reply being written on stdout."""

    def __init__(self, runner: ChatRunner) -> None:
        self.runner = runner

    def write(self, text: str) -> int:
        if self.runner.line_open:
            sys.stdout.write("\n")
            sys.stdout.flush()
            self.runner.line_open = False
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


class ChatRunner:
    """Owns the engine for one kvmem-cli invocation."""

    def __init__(self, ns: argparse.Namespace, settings: EngineSettings) -> None:
        self.ns = ns
        self.engine = Engine(settings)
        self.line_open = False  # a reply's line on stdout has no newline yet
        self.chat = bool(ns.interactive)
        if self.chat:  # one-shot output stays byte for byte what was generated
            self.engine.tracer.stream = _LineStart(self)
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

    def _banner(self) -> str:
        info, kv = self.engine.info, self.engine.settings.kvmem
        window = (
            f"KVMem window {kv.budget} + {kv.gen_reserve} tokens"
            if kv.enabled
            else "KVMem off (--no-kvmem)"
        )
        return (
            f"kvmem-cli: chat with {Path(info.path).name} ({info.n_ctx}-token context, {window}).\n"
            "/help for commands, /exit or Ctrl-D to leave, Ctrl-C stops a reply."
        )

    def _interactive(self) -> int:
        print(self._banner(), flush=True)
        first = self._initial_prompt()
        if first:
            self._turn(first)
        while True:
            try:
                line = input("> ").strip()
            except EOFError:
                print()
                return 0
            except KeyboardInterrupt:  # at the prompt: a fresh line, the chat goes on
                print("\n(/exit or Ctrl-D to leave)")
                continue
            if line in ("/exit", "/quit"):
                return 0
            if line == "/help":
                print(HELP)
            elif line == "/reset":
                self.engine.reset()
                self.messages = [m for m in self.messages if m["role"] == "system"]
                self.raw_history = []
                print("(conversation forgotten)")
            elif line.startswith("/"):
                print(f"unknown command {line.split()[0]}: /help lists them")
            elif line:
                self._turn(line)

    def _turn(self, text: str) -> str:
        tokens, query = self._prompt_tokens(text)
        cancel = threading.Event()  # Ctrl-C in a chat: the turn stops at its next step
        previous = signal.signal(signal.SIGINT, lambda *_: cancel.set()) if self.chat else None
        try:
            answer = self._write_reply(tokens, query, cancel)
        except TurnCancelledError:  # stopped while the prompt was processed
            answer = None
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
        if answer is None:
            print("[stopped before the reply]")
            if self.template is not None:
                self.messages.pop()  # as if the message was never sent
            return ""
        if cancel.is_set():
            print("[stopped]")
        if self.template is not None:
            self.messages.append({"role": "assistant", "content": answer})
        return answer

    def _write_reply(
        self, tokens: list[int], query: TokenSpan | None, cancel: threading.Event
    ) -> str:
        detok = IncrementalDetokenizer(self.engine)
        out: list[str] = []
        for token in self.engine.generate(
            tokens,
            query=query,
            sampling=self.sampling,
            max_tokens=self.ns.n_predict,
            ignore_eos=self.ns.ignore_eos,
            cancel=cancel,
        ):
            self.raw_history.append(token)
            piece = detok.push(token)
            out.append(piece)
            sys.stdout.write(piece)
            sys.stdout.flush()
            self.line_open = True
        tail = detok.flush()
        out.append(tail)
        if tail or self.line_open or not self.chat:  # a trace record may have ended the line
            sys.stdout.write(tail + "\n")
        sys.stdout.flush()
        self.line_open = False
        return "".join(out)

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
