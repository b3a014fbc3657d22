"""The generation loop behind kvmem-cli: one-shot or interactive, chat-formatted or raw."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from kvmem.chat.detokenize import IncrementalDetokenizer
from kvmem.chat.prompt import PromptTokens, build_prompt_tokens
from kvmem.chat.template import ChatTemplate
from kvmem.cli.chat_commands import reply_room, save_conversation, switch_trace, too_long
from kvmem.cli.progress_bar import PromptBar
from kvmem.engine.engine import Engine
from kvmem.engine_settings import EngineSettings
from kvmem.errors import ConfigError, TurnCancelledError
from kvmem.memory.spans import TokenSpan
from kvmem.sampling import SamplingParams

HELP = """commands:
  /help          this list
  /reset         forget the conversation (and its KV history)
  /save FILE     write the conversation to FILE as JSON
  /trace [on|off]  switch the KVMem trace (KVMEM_* records on stderr)
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
            elif line.partition(" ")[0] in ("/save", "/trace"):
                print(self._command(line))
            elif line.startswith("/"):
                print(f"unknown command {line.split()[0]}: /help lists them")
            elif line:
                self._turn(line)

    def _command(self, line: str) -> str:
        name, _, arg = line.partition(" ")
        arg = arg.strip()
        if name == "/save":
            return save_conversation(self, arg)
        return switch_trace(self.engine.tracer, arg)

    def _turn(self, text: str) -> str:
        prompt = self._prompt_tokens(text)
        if prompt is None:
            return ""
        tokens, query = prompt
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
        else:
            self._mark_cut()
        if self.template is not None:
            self.messages.append({"role": "assistant", "content": answer})
        return answer

    def _write_reply(
        self, tokens: list[int], query: TokenSpan | None, cancel: threading.Event
    ) -> str:
        detok = IncrementalDetokenizer(self.engine)
        out: list[str] = []
        bar = PromptBar(self.ns.progress_bar)
        try:
            for token in self.engine.generate(
                tokens,
                query=query,
                sampling=self.sampling,
                max_tokens=self.ns.n_predict,
                ignore_eos=self.ns.ignore_eos,
                cancel=cancel,
                progress=bar,
            ):
                bar.close()
                self.raw_history.append(token)
                piece = detok.push(token)
                out.append(piece)
                sys.stdout.write(piece)
                sys.stdout.flush()
                self.line_open = True
        finally:
            bar.close()
        tail = detok.flush()
        out.append(tail)
        if tail or self.line_open or not self.chat:  # a trace record may have ended the line
            sys.stdout.write(tail + "\n")
        sys.stdout.flush()
        self.line_open = False
        return "".join(out)

    def _mark_cut(self) -> None:
        """A reply cut by the -n cap or by the context says so: on stdout in a chat, on
        stderr after a one-shot answer (whose stdout stays the generated text)."""
        turn = self.engine.last_turn
        if turn.finish_reason != "length":
            return
        cap = self.ns.n_predict
        if cap > 0 and turn.generated_tokens >= cap:
            note = f"[cut at the -n cap of {cap} tokens]"
        else:
            note = f"[cut: the {self.engine.info.n_ctx}-token context is full]"
        print(note, file=sys.stdout if self.chat else sys.stderr, flush=True)

    def _prompt_tokens(self, text: str) -> tuple[list[int], TokenSpan | None] | None:
        """The turn's prompt and query; in a chat, the oldest turns are dropped first when
        the conversation reaches the context (None: the message alone does not fit)."""
        if self.template is None:
            return self._raw_prompt(text)
        self.messages.append({"role": "user", "content": text})
        prompt: PromptTokens | None = build_prompt_tokens(self.engine, self.template, self.messages)
        n_ctx = self.engine.info.n_ctx
        if self.chat and len(prompt.tokens) + reply_room(n_ctx, self.ns.n_predict) > n_ctx:
            prompt = self._trim(prompt, n_ctx)
        return None if prompt is None else (prompt.tokens, prompt.query)

    def _raw_prompt(self, text: str) -> tuple[list[int], TokenSpan | None] | None:
        new = self.engine.tokenize(text, add_special=not self.raw_history)
        n_ctx = self.engine.info.n_ctx
        if self.chat and len(new) >= n_ctx:
            print(too_long(len(new), n_ctx))
            return None
        full = len(self.raw_history) + len(new) + reply_room(n_ctx, self.ns.n_predict) > n_ctx
        if self.chat and full and self.raw_history:
            keep = max(0, n_ctx // 2 - len(new))
            self.raw_history = self.raw_history[len(self.raw_history) - keep :] if keep else []
            print(f"(the chat reached the {n_ctx}-token context: its oldest tokens were dropped)")
        start = len(self.raw_history)
        self.raw_history += new
        return list(self.raw_history), TokenSpan(start, len(self.raw_history))

    def _trim(self, prompt: PromptTokens, n_ctx: int) -> PromptTokens | None:
        """Drop the oldest messages (never the system message or the new one) until the
        prompt takes at most half the context, so that the next turns reuse it again."""
        dropped = 0
        while len(prompt.tokens) > n_ctx // 2:
            oldest = next(
                (i for i, m in enumerate(self.messages[:-1]) if m["role"] != "system"), None
            )
            if oldest is None:
                break
            del self.messages[oldest]
            dropped += 1
            if oldest < len(self.messages) - 1 and self.messages[oldest]["role"] == "assistant":
                del self.messages[oldest]  # its reply goes with it: the chat starts with a user
                dropped += 1
            prompt = build_prompt_tokens(self.engine, self.template, self.messages)
        if len(prompt.tokens) >= n_ctx:
            self.messages.pop()
            print(too_long(len(prompt.tokens), n_ctx))
            return None
        if dropped:
            print(
                f"(the conversation reached the {n_ctx}-token context: "
                f"the oldest {dropped} messages were dropped)"
            )
        return prompt

    def close(self) -> None:
        self.engine.close()
