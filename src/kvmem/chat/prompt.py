"""Messages -> prompt text -> tokens, with the KVMem retrieval query span.

The query of a turn is the last role=user message: the conversation is rendered up to and
including that message, the message's text is located in it, and its character span is
mapped onto the tokens of the whole prompt. The whole prompt is tokenized in one piece
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
from kvmem.engine import TokenSpan
from kvmem.errors import TemplateError

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


@dataclass(slots=True)
class PromptTokens:
    tokens: list[int]
    query: TokenSpan | None
    text: str = ""
    opens_reasoning: bool = False


def render_prompt(
    template: ChatTemplate,
    messages: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None = None,
    template_kwargs: dict[str, Any] | None = None,
    add_generation_prompt: bool = True,
    prefill: str = "",
) -> RenderedPrompt:
    """Render normalized messages with a generation prompt and locate the query text.

    `prefill` (an assistant prefill, kvmem.chat.prefill) is appended to the rendering."""
    kwargs = dict(template_kwargs or {})
    if "enable_thinking" not in kwargs and "enable_thinking" in template.source:
        kwargs["enable_thinking"] = True  # llama-server's --reasoning auto: on where offered
    text = template.render(
        messages, add_generation_prompt=add_generation_prompt, tools=tools, **kwargs
    )
    opens = prompt_opens_reasoning(text, template.reasoning)
    if opens and kwargs.get("enable_thinking") is False and template.reasoning and not prefill:
        # thinking is off but the template always opens the block: close it (as llama.cpp does)
        text += template.reasoning.close
        opens = False
    text += prefill
    return RenderedPrompt(
        text=text,
        query_chars=_query_chars(template, messages, text, tools, kwargs),
        opens_reasoning=opens if not prefill else prompt_opens_reasoning(text, template.reasoning),
    )


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
    query = None
    if rendered.query_chars is not None:
        start, end = rendered.query_chars.start - shift, rendered.query_chars.end - shift
        if 0 <= start < end <= len(text):
            t0 = _agreeing_prefix(engine, text[:start], body)
            t1 = _agreeing_prefix(engine, text[:end], body)
            if t1 > t0:
                query = TokenSpan(t0 + len(head), t1 + len(head))
    return PromptTokens(head + body, query, rendered.text, rendered.opens_reasoning)


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
