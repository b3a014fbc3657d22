"""Messages -> prompt text -> tokens, with the spans the KVMem window treats specially.

The spans: the control text (everything before the first non-system message: the system
prompt and the tool definitions), the task (the last role=user message), the live
trajectory after it (assistant tool calls and tool results) and the last message. The
task is located by rendering the conversation up to and including it; each character
span is mapped onto the tokens of the whole prompt. The whole prompt is tokenized in one piece
(so that the next turn, which renders the same prefix, tokenizes it identically and the
session reuses its KV); the span's token boundaries are where the tokenizations of the
text before the span and of the text up to its end stop agreeing with the whole.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from kvmem.chat.messages import last_user_index, normalize_messages
from kvmem.chat.protocol import ChatEngine
from kvmem.chat.reasoning import prompt_opens_reasoning
from kvmem.chat.template import ChatTemplate
from kvmem.errors import TemplateError
from kvmem.memory.spans import PromptSpans, TokenSpan

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CharSpan:
    start: int
    end: int


@dataclass(slots=True)
class RenderedPrompt:
    text: str
    query_chars: CharSpan | None  # the last user message's text inside `text`
    opens_reasoning: bool  # the generation prompt ends inside a thinking block
    control_end: int | None = None  # the control text is text[:control_end]
    live_start: int | None = None  # the last message's text starts here
    has_trajectory: bool = False  # messages follow the last user message


@dataclass(slots=True)
class PromptTokens:
    tokens: list[int]
    query: TokenSpan | None
    text: str = ""
    opens_reasoning: bool = False
    spans: PromptSpans | None = None  # every span; None: the query alone


def render_prompt(
    template: ChatTemplate,
    messages: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None = None,
    template_kwargs: dict[str, Any] | None = None,
) -> RenderedPrompt:
    """Render normalized messages with a generation prompt and locate the query text."""
    kwargs = template_kwargs or {}
    text = template.render(messages, add_generation_prompt=True, tools=tools, **kwargs)
    index = last_user_index(messages)
    return RenderedPrompt(
        text=text,
        query_chars=_query_chars(template, messages, text, tools, kwargs),
        opens_reasoning=prompt_opens_reasoning(text, template.reasoning),
        control_end=_control_end(template, messages, text, tools, kwargs),
        live_start=_content_start(text, messages[-1]),
        has_trajectory=index is not None and index < len(messages) - 1,
    )


def _content_start(text: str, message: dict[str, Any]) -> int | None:
    content = message.get("content")
    if not isinstance(content, str) or not content:
        return None
    start = text.rfind(content)
    return None if start == -1 else start


def _control_end(
    template: ChatTemplate,
    messages: list[dict[str, Any]],
    full: str,
    tools: list[dict[str, Any]] | None,
    kwargs: dict[str, Any],
) -> int | None:
    """Where the control text ends: after the leading system messages as rendered, or,
    without one, where the first message's text starts (a default system prompt and the
    tool definitions come before it)."""
    k = 0
    while k < len(messages) and messages[k]["role"] == "system":
        k += 1
    if 0 < k < len(messages):
        try:
            head = template.render(messages[:k], add_generation_prompt=False, tools=tools, **kwargs)
        except TemplateError:
            head = ""
        if head and full.startswith(head):
            return len(head)
    if k == len(messages):
        return None
    content = messages[k].get("content")
    if not isinstance(content, str) or not content:
        return None
    start = full.find(content)
    return start if start > 0 else None


def _query_chars(
    template: ChatTemplate,
    messages: list[dict[str, Any]],
    full: str,
    tools: list[dict[str, Any]] | None,
    kwargs: dict[str, Any],
) -> CharSpan | None:
    index = last_user_index(messages)
    if index is None:
        return None
    content = messages[index]["content"]
    if not isinstance(content, str) or not content:
        return None
    try:
        upto = template.render(
            messages[: index + 1], add_generation_prompt=False, tools=tools, **kwargs
        )
    except TemplateError:
        upto = full
    start = upto.rfind(content)
    if start == -1 or full[start : start + len(content)] != content:
        start = full.rfind(content)
    if start == -1:
        logger.debug("the last user message is not in the rendered prompt; no query span")
        return None
    return CharSpan(start, start + len(content))


def tokenize_prompt(engine: ChatEngine, rendered: RenderedPrompt) -> PromptTokens:
    """Tokenize a rendered prompt (BOS added once, as llama.cpp does) and map the query span."""
    info = engine.info
    text = rendered.text
    shift = 0
    if info.add_bos and info.bos_text and text.startswith(info.bos_text):
        text = text[len(info.bos_text) :]  # the template wrote BOS itself; add it as a token
        shift = len(info.bos_text)
    head = [info.bos_token_id] if info.add_bos else []
    body = engine.tokenize(text, add_special=False, parse_special=True)
    n = len(head) + len(body)

    def token_at(char: int | None) -> int | None:
        """The token index where text position `char` (of the rendered text) falls."""
        if char is None or not 0 <= char - shift <= len(text):
            return None
        return _agreeing_prefix(engine, text[: char - shift], body) + len(head)

    query = None
    if rendered.query_chars is not None:
        t0, t1 = token_at(rendered.query_chars.start), token_at(rendered.query_chars.end)
        if t0 is not None and t1 is not None and t1 > t0:
            query = TokenSpan(t0, t1)
    control_end = token_at(rendered.control_end)
    live = token_at(rendered.live_start)
    spans = PromptSpans(
        control=TokenSpan(0, control_end) if control_end else None,
        query=query,
        trajectory=TokenSpan(query.end, n) if query and rendered.has_trajectory else None,
        live=TokenSpan(live, n) if live is not None and live < n else None,
    )
    return PromptTokens(head + body, query, rendered.text, rendered.opens_reasoning, spans)


def _agreeing_prefix(engine: ChatEngine, prefix_text: str, tokens: list[int]) -> int:
    """How many leading `tokens` the tokenization of `prefix_text` reproduces."""
    if not prefix_text:
        return 0
    part = engine.tokenize(prefix_text, add_special=False, parse_special=True)
    n = 0
    for a, b in zip(part, tokens, strict=False):
        if a != b:
            break
        n += 1
    return n


def build_prompt_tokens(
    engine: ChatEngine,
    template: ChatTemplate,
    messages: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None = None,
    template_kwargs: dict[str, Any] | None = None,
) -> PromptTokens:
    """OpenAI-style messages -> `PromptTokens(tokens, query)` for `engine.generate`.

    Messages are validated and normalized first (`normalize_messages` is idempotent);
    InvalidRequestError/TemplateError report problems.
    """
    normalized = normalize_messages(messages)
    rendered = render_prompt(template, normalized, tools=tools, template_kwargs=template_kwargs)
    return tokenize_prompt(engine, rendered)
