"""Messages -> prompt text -> tokens, with the spans the KVMem window treats specially.

The spans: the control text (everything before the first non-system message: the system
prompt and the tool definitions), the task (the last role=user message), the live
trajectory after it (assistant tool calls and tool results) and the last message. The
task is located by rendering the conversation up to and including it; each character
span is mapped onto the tokens of the prompt.

Tokenization happens once per request. Only the template's own control tokens are special
(`kvmem.chat.markup` finds them); every other character, including a control-token text
typed in a message, is tokenized as plain text. The prompt is cut at the markup tokens
(where llama.cpp's tokenizer cuts it anyway) and each piece is tokenized on its own, so a
prompt without forged tokens gets exactly the tokens a whole-text tokenization gives, and
the next turn, which renders the same prefix, gets the same prefix tokens (KV reuse).
The query span's token boundaries come from the tokens' byte lengths.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvmem.chat.images import PromptImage
from kvmem.chat.markup import markup_spans, special_pattern
from kvmem.chat.messages import last_user_index, normalize_messages
from kvmem.chat.protocol import ChatEngine
from kvmem.chat.reasoning import prompt_opens_reasoning
from kvmem.chat.template import ChatTemplate
from kvmem.errors import InvalidRequestError, TemplateError
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
    markup: tuple[tuple[int, int], ...] = ()  # the template's control tokens in `text`
    images: tuple[PromptImage, ...] = ()  # in order; each is `image_marker` in `text`
    image_marker: str = ""


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
    add_generation_prompt: bool = True,
    prefill: str = "",
) -> RenderedPrompt:
    """Render normalized messages with a generation prompt and locate the query text.

    `prefill` (an assistant prefill, kvmem.chat.prefill) is appended to the rendering."""
    kwargs = dict(template_kwargs or {})
    if "enable_thinking" not in kwargs and "enable_thinking" in template.source:
        kwargs["enable_thinking"] = True  # llama-server's --reasoning auto: on where offered
    index = last_user_index(messages)

    def finish(raw: str) -> tuple[str, bool]:
        opens = prompt_opens_reasoning(raw, template.reasoning)
        if opens and kwargs.get("enable_thinking") is False and template.reasoning and not prefill:
            # thinking is off but the template always opens the block: close it (as llama.cpp)
            raw += template.reasoning.close
            opens = False
        raw += prefill
        return raw, opens if not prefill else prompt_opens_reasoning(raw, template.reasoning)

    def render_neutral(transform: Callable[[Any], Any]) -> str:
        raw = template.render(
            transform(messages),
            add_generation_prompt=add_generation_prompt,
            tools=transform(tools),
            **transform(kwargs),
        )
        return finish(raw)[0]

    text, opens = finish(
        template.render(
            messages, add_generation_prompt=add_generation_prompt, tools=tools, **kwargs
        )
    )
    pattern = special_pattern(getattr(template, "special_texts", ()))
    return RenderedPrompt(
        text=text,
        query_chars=_query_chars(template, messages, text, tools, kwargs),
        opens_reasoning=opens,
        control_end=_control_end(template, messages, text, tools, kwargs),
        live_start=len(text) - len(prefill) if prefill else _content_start(text, messages),
        has_trajectory=index is not None and index < len(messages) - 1,
        markup=markup_spans(text, pattern, (messages, tools, kwargs), render_neutral),
    )


def _content_start(text: str, messages: list[dict[str, Any]]) -> int | None:
    """Where the last message's text starts in `text` (None: no messages or no text)."""
    if not messages:
        return None
    content = messages[-1].get("content")
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
    """Tokenize a rendered prompt once (BOS added once, as llama.cpp does): the markup
    spans as special tokens, everything else as plain text; map the query span."""
    info = engine.info
    text = rendered.text
    shift = 0
    if info.add_bos and info.bos_text and text.startswith(info.bos_text):
        shift = len(info.bos_text)  # the template wrote BOS itself; add it as a token
    tokens = [info.bos_token_id] if info.add_bos else []
    pieces: list[_Piece] = []
    pos = shift
    images = _ImageCursor(engine, rendered)
    for start, end in rendered.markup:
        if start < pos:
            continue
        if start > pos:
            pieces += images.plain(text, pos, start, tokens)
        special = engine.tokenize(text[start:end], add_special=False, parse_special=True)
        pieces.append(_Piece(start, end, len(tokens), len(tokens) + len(special), True))
        tokens += special
        pos = end
    if pos < len(text):
        pieces += images.plain(text, pos, len(text), tokens)
    images.check_done()
    n = len(tokens)

    def token_at(char: int | None) -> int | None:
        return None if char is None else _token_at(engine, text, pieces, tokens, char)

    query = None
    if rendered.query_chars is not None:
        t0, t1 = token_at(rendered.query_chars.start), token_at(rendered.query_chars.end)
        if t0 is not None and t1 is not None and t1 > t0:
            query = TokenSpan(t0, t1)
    control_end, live = token_at(rendered.control_end), token_at(rendered.live_start)
    spans = PromptSpans(
        control=TokenSpan(0, control_end) if control_end else None,
        query=query,
        trajectory=TokenSpan(query.end, n) if query and rendered.has_trajectory else None,
        live=TokenSpan(live, n) if live is not None and live < n else None,
        groups=tuple(images.groups),
    )
    return PromptTokens(tokens, query, rendered.text, rendered.opens_reasoning, spans)


@dataclass(frozen=True, slots=True)
class _Piece:
    start: int  # characters of the rendered text
    end: int
    t0: int  # its tokens in the prompt
    t1: int
    special: bool


def _plain(engine: ChatEngine, text: str, start: int, end: int, tokens: list[int]) -> _Piece:
    part = engine.tokenize(text[start:end], add_special=False, parse_special=False)
    piece = _Piece(start, end, len(tokens), len(tokens) + len(part), False)
    tokens += part
    return piece


class _ImageCursor:
    """Plain text with image markers: the text between them tokenized as plain text, each
    marker replaced by the next image's items (its rows' stand-ins), a special piece."""

    def __init__(self, engine: ChatEngine, rendered: RenderedPrompt) -> None:
        self.engine, self.images, self.marker = engine, rendered.images, rendered.image_marker
        self.used = 0
        self.groups: list[TokenSpan] = []  # each image's items in the prompt

    def plain(self, text: str, start: int, end: int, tokens: list[int]) -> list[_Piece]:
        if not self.images:
            return [_plain(self.engine, text, start, end, tokens)]
        pieces: list[_Piece] = []
        pos = start
        while pos < end:
            at = text.find(self.marker, pos, end)
            if at < 0:
                at = end
            if at > pos:
                pieces.append(_plain(self.engine, text, pos, at, tokens))
            if at == end:
                break
            if self.used == len(self.images):
                raise InvalidRequestError(
                    "the rendered prompt has more images than sent", "messages"
                )
            image = self.images[self.used]
            self.used += 1
            items = self.engine.image_items(image.digest, image.width, image.height, image.rgb)
            stop = at + len(self.marker)
            pieces.append(_Piece(at, stop, len(tokens), len(tokens) + len(items), True))
            self.groups.append(TokenSpan(len(tokens), len(tokens) + len(items)))
            tokens += items
            pos = stop
        return pieces

    def check_done(self) -> None:
        if self.used != len(self.images):
            raise InvalidRequestError(
                f"the chat template placed {self.used} of the {len(self.images)} images "
                "(images are only supported where the template renders the message content)",
                "messages",
            )


def _token_at(
    engine: ChatEngine, text: str, pieces: list[_Piece], tokens: list[int], offset: int
) -> int:
    """The index of the first token that ends after character `offset` (len(tokens) at
    the end): tokens [token_at(a), token_at(b)) cover the characters [a, b)."""
    for piece in pieces:
        if offset >= piece.end:
            continue
        if offset <= piece.start or piece.special:
            return piece.t0
        target = len(text[piece.start : offset].encode("utf-8"))
        consumed = 0
        for i in range(piece.t0, piece.t1):
            consumed += len(engine.token_bytes(tokens[i]))
            if consumed > target:
                return i
        return piece.t1
    return len(tokens)


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
