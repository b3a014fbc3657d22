"""Benchmark conversations and their rendering to tokens, with the retrieval query span.

With a real model the benchmarks render through the chat layer, exactly as kvmem-server
does (`TemplateRenderer`: the GGUF's Jinja template, the whole prompt tokenized in one
piece, the query = the last user message). `ChatMLRenderer` renders ChatML message by
message; the unit tests use it with fake engines that have no template.

Messages may carry OpenAI-style tool calls (assistant `tool_calls`, `tool` results with a
`tool_call_id`) and a prompt may carry tool definitions; the template renders both as the
server would (Qwen: Hermes `<tool_call>` blocks, tools in the system prompt). `span_of`
finds a piece of text's token span in a rendered prompt (the oracle's needle span).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

from kvmem.chat.messages import normalize_messages
from kvmem.chat.prompt import build_prompt_tokens
from kvmem.chat.template import ChatTemplate
from kvmem.memory.spans import PromptSpans, TokenSpan


class Role(Enum):
    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # a JSON object, as text (OpenAI's wire form)


@dataclass(frozen=True, slots=True)
class Message:
    role: Role
    content: str
    tool_calls: tuple[ToolCall, ...] = ()  # assistant messages only
    tool_call_id: str | None = None  # tool messages only


Tools = Sequence[dict[str, Any]]


@dataclass(slots=True)
class RenderedPrompt:
    """Prompt tokens, the span of the last user message's content, and per-message spans."""

    tokens: list[int]
    query: TokenSpan | None
    message_spans: list[TokenSpan] = field(default_factory=list)  # content span of each message
    system_end: int = 0  # tokens up to the end of a leading system message (0: none)
    text: str = ""  # the rendered text (TemplateRenderer only), before the answer prefix
    spans: PromptSpans | None = None  # the window's spans (control, task, trajectory, live)

    def __len__(self) -> int:
        return len(self.tokens)


class Tokenizer(Protocol):
    def tokenize(
        self, text: str, *, add_special: bool = False, parse_special: bool = True
    ) -> list[int]: ...


class PromptRenderer(Protocol):
    def render(
        self,
        messages: Sequence[Message],
        *,
        add_generation_prompt: bool = True,
        answer_prefix: str = "",
        tools: Tools | None = None,
    ) -> RenderedPrompt: ...

    def reply_tokens(
        self, messages: Sequence[Message], reply: str, prompt: RenderedPrompt
    ) -> list[int]:
        """The tokens of assistant `reply` to `prompt` (= render(messages)), through its end
        marker, as the next turn's prompt will hold them."""
        ...

    def span_of(
        self,
        messages: Sequence[Message],
        prompt: RenderedPrompt,
        text: str,
        tools: Tools | None = None,
    ) -> TokenSpan | None:
        """The tokens of `prompt` (= render(messages, tools=tools, ...)) that hold the last
        occurrence of `text` in a message, or None."""
        ...


class ChatMLRenderer:
    """ChatML, tokenized message by message (content without special-token parsing)."""

    def __init__(self, tokenizer: Tokenizer, bos_token: int | None = None) -> None:
        self._tok = tokenizer
        self._bos = bos_token
        self._cache: dict[tuple[Role, str], tuple[list[int], list[int]]] = {}
        self._footer = tokenizer.tokenize("<|im_end|>\n", parse_special=True)
        self._gen_header = tokenizer.tokenize("<|im_start|>assistant\n", parse_special=True)

    def render(
        self,
        messages: Sequence[Message],
        *,
        add_generation_prompt: bool = True,
        answer_prefix: str = "",
        tools: Tools | None = None,
    ) -> RenderedPrompt:
        """Render `messages`; with a generation prompt, `answer_prefix` starts the reply.

        Tool calls are rendered as Hermes `<tool_call>` lines after the content, and tool
        definitions as a `<tools>` section at the end of the system message."""
        tokens: list[int] = [self._bos] if self._bos is not None else []
        spans: list[TokenSpan] = []
        query: TokenSpan | None = None
        system_end = 0
        shown = _with_tools(messages, tools)
        for message in shown:
            header, content = self._message_tokens(message)
            tokens += header
            span = TokenSpan(len(tokens), len(tokens) + len(content))
            tokens += content
            tokens += self._footer
            spans.append(span)
            if message.role is Role.SYSTEM and len(spans) == 1:
                system_end = len(tokens)
            if message.role is Role.USER:
                query = span
        if add_generation_prompt:
            tokens += self._gen_header
            if answer_prefix:
                tokens += self._tok.tokenize(answer_prefix, parse_special=True)
        return RenderedPrompt(
            tokens=tokens,
            query=query,
            message_spans=spans,
            system_end=system_end,
            spans=chat_spans(shown, spans, len(tokens)),
        )

    def span_of(
        self,
        messages: Sequence[Message],
        prompt: RenderedPrompt,
        text: str,
        tools: Tools | None = None,
    ) -> TokenSpan | None:
        shown = _with_tools(messages, tools)
        for i in range(min(len(prompt.message_spans), len(shown)) - 1, -1, -1):
            content = _content_text(shown[i])
            at = content.rfind(text)
            if at < 0:
                continue

            def tokenize(part: str) -> list[int]:
                return self._tok.tokenize(part, parse_special=False)

            base = prompt.message_spans[i].start
            return text_span(tokenize, content, at, len(text), tokenize(content), base)
        return None

    def reply_tokens(
        self, messages: Sequence[Message], reply: str, prompt: RenderedPrompt
    ) -> list[int]:
        return self._tok.tokenize(reply, parse_special=False) + self._footer[:1]

    def _message_tokens(self, message: Message) -> tuple[list[int], list[int]]:
        text = _content_text(message)
        key = (message.role, text)
        cached = self._cache.get(key)
        if cached is None:
            header = self._tok.tokenize(f"<|im_start|>{message.role.value}\n", parse_special=True)
            content = self._tok.tokenize(text, parse_special=False)
            cached = (header, content)
            if len(self._cache) > 4096:
                self._cache.clear()
            self._cache[key] = cached
        return cached


def chat_spans(
    messages: Sequence[Message], contents: Sequence[TokenSpan], n_tokens: int
) -> PromptSpans:
    """The window's spans from each message's content span: control text up to the first
    non-system message, the last user message, the trajectory after it, the last message."""
    first = next((i for i, m in enumerate(messages) if m.role is not Role.SYSTEM), None)
    users = [i for i, m in enumerate(messages) if m.role is Role.USER]
    control = TokenSpan(0, contents[first].start) if first is not None else None
    query = contents[users[-1]] if users else None
    trajectory = None
    if users and users[-1] < len(messages) - 1:
        trajectory = TokenSpan(query.end, n_tokens)
    live = TokenSpan(contents[-1].start, n_tokens) if contents else None
    return PromptSpans(control=control, query=query, trajectory=trajectory, live=live)


def _content_text(message: Message) -> str:
    """What ChatML shows of a message: its content, then one Hermes block per tool call."""
    calls = [
        f'<tool_call>\n{{"name": "{c.name}", "arguments": {c.arguments}}}\n</tool_call>'
        for c in message.tool_calls
    ]
    return "\n".join([message.content, *calls] if message.content else calls)


def _with_tools(messages: Sequence[Message], tools: Tools | None) -> list[Message]:
    """ChatML's tool definitions: a `<tools>` section ending the system message."""
    if not tools:
        return list(messages)
    section = "# Tools\n<tools>\n" + "\n".join(json.dumps(t) for t in tools) + "\n</tools>"
    if messages and messages[0].role is Role.SYSTEM:
        head = messages[0]
        return [Message(Role.SYSTEM, f"{head.content}\n\n{section}"), *messages[1:]]
    return [Message(Role.SYSTEM, section), *messages]


def text_span(
    tokenize: Callable[[str], Sequence[int]],
    text: str,
    at: int,
    length: int,
    whole: Sequence[int],
    base: int,
) -> TokenSpan | None:
    """The tokens of `whole` (the tokens of `text`, placed from `base` in the prompt) that
    hold text[at : at + length], found by tokenizing the text's prefixes; None if empty."""
    start = _token_boundary(tokenize(text[:at]), whole, round_up=False)
    end = _token_boundary(tokenize(text[: at + length]), whole, round_up=True)
    return TokenSpan(base + start, base + end) if end > start else None


def _token_boundary(part: Sequence[int], whole: Sequence[int], round_up: bool) -> int:
    """Where the text that `part` tokenizes ends in `whole`, in tokens: the tokens both
    agree on, plus (with `round_up`) the token of `whole` the text ends inside, if any
    (as when Qwen merges a needle's final "." with the newline after it)."""
    n = 0
    for a, b in zip(part, whole, strict=False):
        if a != b:
            break
        n += 1
    return n + 1 if round_up and n < len(part) else n


def last_tokens_only(prompt: RenderedPrompt, n_keep: int) -> RenderedPrompt:
    """The "last N tokens" baseline: the system prompt plus the last tokens of the prompt,
    `n_keep` in all, with the query span moved along (clipped when it starts before the
    kept tail)."""
    if len(prompt.tokens) <= n_keep:
        return prompt
    n_head = min(prompt.system_end, n_keep // 2)
    n_tail = n_keep - n_head
    cut = len(prompt.tokens) - n_tail
    tokens = prompt.tokens[:n_head] + prompt.tokens[cut:]
    query = None
    if prompt.query is not None and prompt.query.end > cut:
        shift = cut - n_head
        query = TokenSpan(max(prompt.query.start, cut) - shift, prompt.query.end - shift)
    return RenderedPrompt(tokens=tokens, query=query, message_spans=[], system_end=n_head)


class TemplateRenderer:
    """The chat layer's rendering with the model's own template, as kvmem-server does it."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self._template = ChatTemplate.from_engine_info(engine.info)
        end = engine.tokenize("<|im_end|>", parse_special=True)
        self._end_token = end[0] if len(end) == 1 else engine.info.eos_token_id

    def render(
        self,
        messages: Sequence[Message],
        *,
        add_generation_prompt: bool = True,
        answer_prefix: str = "",
        tools: Tools | None = None,
    ) -> RenderedPrompt:
        dicts = _dicts(messages)
        tool_list = list(tools) if tools else None
        if add_generation_prompt:
            built = build_prompt_tokens(self._engine, self._template, dicts, tools=tool_list)
            tokens, query, text, spans = built.tokens, built.query, built.text, built.spans
        else:
            text = self._template.render(dicts, add_generation_prompt=False, tools=tool_list)
            tokens, query, spans = self._tokens(text), None, None
        if answer_prefix:  # special tokens too: an answer may start with `<tool_call>`
            tokens = tokens + self._engine.tokenize(answer_prefix, parse_special=True)
        system_end = 0
        if messages and messages[0].role is Role.SYSTEM:
            head = self._tokens(
                self._template.render(dicts[:1], add_generation_prompt=False, tools=tool_list)
            )
            if tokens[: len(head)] == head:
                system_end = len(head)
        return RenderedPrompt(
            tokens=tokens, query=query, system_end=system_end, text=text, spans=spans
        )

    def span_of(
        self,
        messages: Sequence[Message],
        prompt: RenderedPrompt,
        text: str,
        tools: Tools | None = None,
    ) -> TokenSpan | None:
        at = prompt.text.rfind(text)
        if at < 0:
            return None
        info = self._engine.info
        body, shift = prompt.text, 0
        if info.add_bos and info.bos_text and body.startswith(info.bos_text):
            body, shift = body[len(info.bos_text) :], len(info.bos_text)
        head = 1 if info.add_bos else 0

        def tokenize(part: str) -> list[int]:
            return self._engine.tokenize(part, add_special=False, parse_special=True)

        return text_span(tokenize, body, at - shift, len(text), prompt.tokens[head:], head)

    def reply_tokens(
        self, messages: Sequence[Message], reply: str, prompt: RenderedPrompt
    ) -> list[int]:
        dicts = _dicts([*messages, Message(Role.ASSISTANT, reply)])
        full = self._tokens(self._template.render(dicts, add_generation_prompt=False))
        n = len(prompt.tokens)
        if full[:n] == prompt.tokens and self._end_token in full[n:]:
            tail = full[n:]
            return tail[: tail.index(self._end_token) + 1]
        return self._engine.tokenize(reply, parse_special=False) + [self._end_token]

    def _tokens(self, text: str) -> list[int]:
        info = self._engine.info
        head = [info.bos_token_id] if info.add_bos else []
        if info.add_bos and info.bos_text and text.startswith(info.bos_text):
            text = text[len(info.bos_text) :]
        return head + self._engine.tokenize(text, add_special=False, parse_special=True)


def _dicts(messages: Sequence[Message]) -> list[dict[str, Any]]:
    return normalize_messages([_openai_message(m) for m in messages])


def _openai_message(message: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"role": message.role.value, "content": message.content}
    if message.tool_calls:
        out["content"] = message.content or None
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in message.tool_calls
        ]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    return out


def make_renderer(engine: Any) -> PromptRenderer:
    """The chat layer's renderer when the engine has a chat template, else ChatML."""
    if isinstance(getattr(engine.info, "chat_template", None), str):
        return TemplateRenderer(engine)
    bos = engine.info.bos_token_id if engine.info.add_bos else None
    return ChatMLRenderer(engine, bos)
