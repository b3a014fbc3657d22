"""Messages -> prompt text -> tokens, with the spans the KVMem window treats specially.

The spans: the control text (the system prompt and the tool definitions), the task (the
last role=user message: the query), the live trajectory after it (assistant tool calls
and tool results) and the last message. The template is rendered once per request, and
every message's content is located in that one rendering (`kvmem.chat.message_spans`:
trimmed and JSON-encoded forms, right after the role's header where the template has
one); each character span is then mapped onto the tokens of the prompt. A span that
should exist but is not found is named in `RenderedPrompt.unlocated`: logged, counted
in the template's counters (/props) and carried to the engine (its trace says so).

Tokenization happens once per request. Only the template's own control tokens are special
(`kvmem.chat.markup` finds them in the same rendering); every other character, including
a control-token text typed in a message, is tokenized as plain text. The prompt is cut at
the markup tokens (where llama.cpp's tokenizer cuts it anyway) and each piece is tokenized
on its own, so a prompt without forged tokens gets exactly the tokens a whole-text
tokenization gives, and the next turn, which renders the same prefix, gets the same prefix
tokens (KV reuse). Span token boundaries come from the tokens' byte lengths.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from kvmem.chat.harness import PinnedText
from kvmem.chat.images import PromptImage
from kvmem.chat.markup import Mask, markup_spans, mask_for, special_pattern
from kvmem.chat.message_spans import CharSpan, locate_messages, prompt_char_spans
from kvmem.chat.messages import normalize_messages
from kvmem.chat.protocol import ChatEngine
from kvmem.chat.reasoning import prompt_opens_reasoning
from kvmem.chat.template import ChatTemplate
from kvmem.errors import InvalidRequestError
from kvmem.memory.spans import PromptSpans, TokenSpan

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class RenderedPrompt:
    text: str
    query_chars: CharSpan | None  # the last user message's text inside `text`
    opens_reasoning: bool  # the generation prompt ends inside a thinking block
    control_end: int | None = None  # the control text is text[:control_end]
    live_start: int | None = None  # the last message's text starts here
    has_trajectory: bool = False  # messages follow the last user message
    trajectory_start: int | None = None  # the trajectory is text[trajectory_start:]
    markup: tuple[tuple[int, int], ...] = ()  # the template's control tokens in `text`
    images: tuple[PromptImage, ...] = ()  # in order; each is `image_marker` in `text`
    image_marker: str = ""
    unlocated: tuple[str, ...] = ()  # spans that exist but were not found in `text`
    pinned: tuple[PinnedText, ...] = ()  # an agent harness's control text (chat.harness)


@dataclass(slots=True)
class PromptTokens:
    tokens: list[int]
    query: TokenSpan | None
    text: str = ""
    opens_reasoning: bool = False
    spans: PromptSpans | None = None  # every span; None: the query alone
    pinned_names: tuple[str, ...] = ()  # what each of spans.pinned is (chat.harness)


def render_prompt(
    template: ChatTemplate,
    messages: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None = None,
    template_kwargs: dict[str, Any] | None = None,
    add_generation_prompt: bool = True,
    prefill: str = "",
) -> RenderedPrompt:
    """Render normalized messages once, with a generation prompt, and locate the spans.

    `prefill` (an assistant prefill, kvmem.chat.prefill) is appended to the rendering.
    Control-token texts typed in the request are masked for the render and written back
    after it (`kvmem.chat.markup`), so the markup and every span come from one render."""
    kwargs = dict(template_kwargs or {})
    if "enable_thinking" not in kwargs and "enable_thinking" in template.source:
        kwargs["enable_thinking"] = True  # llama-server's --reasoning auto: on where offered
    pattern = special_pattern(getattr(template, "special_texts", ()))
    avoid = template.source + template.bos_token + template.eos_token
    mask = mask_for(pattern, (messages, tools, kwargs, prefill), avoid)
    shown = _Masked(mask, messages, tools, kwargs)
    raw = template.render(
        shown.messages,
        add_generation_prompt=add_generation_prompt,
        tools=shown.tools,
        **shown.kwargs,
    )
    opens = prompt_opens_reasoning(raw, template.reasoning)
    if opens and kwargs.get("enable_thinking") is False and template.reasoning and not prefill:
        # thinking is off but the template always opens the block: close it (as llama.cpp)
        raw += template.reasoning.close
        opens = False
    generated = len(raw)  # the rendering without the prefill
    raw += shown.prefill(prefill)
    limit = generated
    gen = template.layout.generation_prompt
    if add_generation_prompt and gen and raw.startswith(gen, generated - len(gen)):
        limit = generated - len(gen)  # no message text lies in the generation prompt
    found = locate_messages(raw, shown.messages, template.layout, limit)
    restored = mask.restore(raw) if mask is not None else None
    text = restored.text if restored is not None else raw
    if prefill:  # the model continues the prefill: does it leave a thinking block open?
        opens = prompt_opens_reasoning(text, template.reasoning)
    spans = prompt_char_spans(messages, found, prefill_at=generated if prefill else None)
    rendered = RenderedPrompt(
        text=text,
        query_chars=spans.query,
        opens_reasoning=opens,
        control_end=spans.control_end,
        live_start=spans.live_start,
        has_trajectory=spans.has_trajectory,
        trajectory_start=spans.trajectory_start,
        markup=markup_spans(text, pattern, restored.typed if restored is not None else ()),
        unlocated=spans.unlocated,
    )
    if rendered.unlocated:
        template.counters.count_unlocated(rendered.unlocated)
        logger.warning(
            "prompt spans not found in the rendered template: %s (retrieval scores without them)",
            ", ".join(rendered.unlocated),
        )
    return rendered


class _Masked:
    """The request's values as rendered: control-token texts masked (or as they are)."""

    def __init__(
        self,
        mask: Mask | None,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        kwargs: dict[str, Any],
    ) -> None:
        self.mask = mask
        self.messages = mask.apply(messages) if mask else messages
        self.tools = mask.apply(tools) if mask else tools
        self.kwargs = mask.apply(kwargs) if mask else kwargs

    def prefill(self, text: str) -> str:
        return self.mask.apply(text) if self.mask and text else text


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
    pinned = [
        (part.name, TokenSpan(t0, t1))
        for part in rendered.pinned
        if (t0 := token_at(part.chars.start)) is not None
        and (t1 := token_at(part.chars.end)) is not None
        and t1 > t0
    ]
    control_end, live = token_at(rendered.control_end), token_at(rendered.live_start)
    trajectory = token_at(rendered.trajectory_start) if rendered.has_trajectory else None
    if query is not None and rendered.has_trajectory:
        trajectory = query.end  # the trajectory follows the task's last token
    spans = PromptSpans(
        control=TokenSpan(0, control_end) if control_end else None,
        query=query,
        trajectory=TokenSpan(trajectory, n) if trajectory is not None and trajectory < n else None,
        live=TokenSpan(live, n) if live is not None and live < n else None,
        groups=tuple(images.groups),
        pinned=tuple(span for _, span in pinned),
        unlocated=rendered.unlocated,
    )
    prompt = PromptTokens(tokens, query, rendered.text, rendered.opens_reasoning, spans)
    prompt.pinned_names = tuple(name for name, _ in pinned)
    return prompt


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
