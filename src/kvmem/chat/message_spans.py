"""Where each message's text lies in the one rendering of a conversation.

Templates write a message's content with small changes: trimmed (`| trim`, `.strip()`,
`.lstrip('\\n')`: the built-in llama3, llama2, gemma and command-r templates, Qwen3.5,
Llama-3.3), cut after a `</think>` (Qwen3's assistant turns) or as a JSON string
(Llama-3.3's tool results). Each message's content is therefore looked for in a few forms:
the raw text, each trimmed variant and the JSON-encoded one, all sharing the stripped text
as their core; the longest form that fits around an occurrence of the core wins.

Messages are placed last to first. Message i lies before message i+1's header (its start),
and of the occurrences of its core before that point the latest one right after the role's
header (`TemplateLayout.headers`: `<|im_start|>user\\n` + content) is taken; without such an
occurrence among the nearest few, the latest occurrence is. Going backwards keeps the task
(the last user message) exact even when earlier text repeats it: a tool definition, a
default system prompt or an earlier message holding the same words lies before it, and
the text between a content and the next header is the template's short turn end. Control
tokens typed in a message are masked before the render (`kvmem.chat.markup`), so a header
that holds the template's control tokens cannot be matched inside a message.

`prompt_char_spans` turns the located messages into the prompt's spans (query, control
text, trajectory, last message) and names those that should exist but were not found.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kvmem.chat.messages import last_user_index
from kvmem.chat.template_layout import TemplateLayout

_NEAREST = 8  # occurrences of a core tried for one right after its role's header


@dataclass(frozen=True, slots=True)
class CharSpan:
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Located:
    """A message's content in the rendered text: [start, end), after its header."""

    start: int
    end: int
    header: int  # where its role header starts (== start when it has none here)
    anchored: bool  # found right after its role's header


@dataclass(frozen=True, slots=True)
class _Family:
    core: str
    forms: tuple[tuple[str, str], ...]  # (before, after) the core, longest first


def _family(text: str) -> _Family | None:
    core = text.strip()
    if not core:
        return None
    variants = {
        text,
        text.lstrip(),
        text.rstrip(),
        text.strip("\n"),
        text.lstrip("\n"),
        text.rstrip("\n"),
        core,
    }
    forms = sorted(variants, key=lambda f: (-len(f), f))
    pairs = []
    for f in forms:
        at = f.index(core)
        pairs.append((f[:at], f[at + len(core) :]))
    return _Family(core, tuple(pairs))


def _json_family(text: str) -> _Family | None:
    """The content as a JSON string (`| tojson`), quotes included, trimmed or not."""
    core = text.strip()
    if not core:
        return None
    forms = sorted({json.dumps(t, ensure_ascii=False) for t in (text, core)}, key=len)[::-1]
    inner = json.dumps(core, ensure_ascii=False)[1:-1]
    pairs = []
    for f in forms:
        at = f.index(inner)
        pairs.append((f[:at], f[at + len(inner) :]))
    return _Family(inner, tuple(pairs))


def content_families(message: dict[str, Any]) -> list[_Family]:
    """The forms a template may write the message's content in, most likely first."""
    content = message.get("content")
    if not isinstance(content, str):
        return []
    texts = [content]
    if message.get("role") == "assistant" and "</think>" in content:
        texts.append(content.split("</think>")[-1])  # Qwen3 keeps only the answer
    families = [f for t in texts if (f := _family(t)) is not None]
    families += [f for t in texts if (f := _json_family(t)) is not None]
    return families


def _find(text: str, family: _Family, header: str, hi: int) -> Located | None:
    """The latest occurrence of the family before `hi`, preferring one right after
    `header` among the nearest few; the longest form that fits around it."""
    core = family.core
    fallback: Located | None = None
    end = hi
    for _ in range(_NEAREST):
        p = text.rfind(core, 0, end)
        if p < 0:
            break
        end = p + len(core) - 1
        tail = p + len(core)
        fitting = [
            (p - len(before), tail + len(after))
            for before, after in family.forms
            if p >= len(before)
            and tail + len(after) <= hi
            and text.startswith(before, p - len(before))
            and text.startswith(after, tail)
        ]
        for s, e in fitting:
            if header and s >= len(header) and text.startswith(header, s - len(header)):
                return Located(s, e, s - len(header), True)
        if fallback is None and fitting:
            s, e = fitting[0]
            fallback = Located(s, e, s, False)
        if not header:
            break
    return fallback


def locate_messages(
    text: str, messages: list[dict[str, Any]], layout: TemplateLayout, limit: int
) -> list[Located | None]:
    """Each message's content in `text[:limit]`, last to first; None where a message has
    no text or its text is not in the rendering."""
    found: list[Located | None] = [None] * len(messages)
    hi = limit
    for i in range(len(messages) - 1, -1, -1):
        header = layout.headers.get(messages[i].get("role", ""), "")
        candidates = [
            loc
            for family in content_families(messages[i])
            if (loc := _find(text, family, header, hi)) is not None
        ]
        anchored = [loc for loc in candidates if loc.anchored]
        if anchored or candidates:
            found[i] = anchored[0] if anchored else max(candidates, key=lambda c: c.start)
            hi = found[i].header  # type: ignore[union-attr]
    return found


@dataclass(slots=True)
class CharSpans:
    """A prompt's spans in characters of its rendering (see `prompt_char_spans`)."""

    query: CharSpan | None = None
    control_end: int | None = None
    trajectory_start: int | None = None
    live_start: int | None = None
    has_trajectory: bool = False
    unlocated: tuple[str, ...] = ()


def _has_text(message: dict[str, Any]) -> bool:
    content = message.get("content")
    return isinstance(content, str) and bool(content.strip())


def prompt_char_spans(
    messages: list[dict[str, Any]], found: list[Located | None], prefill_at: int | None
) -> CharSpans:
    """The prompt's character spans from the located messages.

    - query: the last user message's content, as the template wrote it (trimmed or not).
    - control end: where the first non-system message's turn begins. When its content
      follows its role header directly (`<|im_start|>user\n` + content) the control text
      ends where that header starts: after the system turn, its tool definitions and its
      turn end. This is the end of a system-only rendering, which is how it was found
      before, without rendering twice; with no system message it is the start of the
      first header (a default system prompt, the tool definitions or BOS before it). When
      the content does not follow the header (gemma and llama2 fold the system text into
      the first user turn, Llama-3.3 writes the tool definitions into it), the control
      text ends where that content begins, so the system text and the tools stay in it.
    - trajectory start: the end of the query (or, without one, the header of the message
      after the last user message); the last message starts at its content (or at the
      prefill, the last message the model continues).
    """
    out = CharSpans()
    missing: list[str] = []
    index = last_user_index(messages)
    out.has_trajectory = index is not None and index < len(messages) - 1
    if index is not None:
        loc = found[index]
        if loc is not None:
            out.query = CharSpan(loc.start, loc.end)
        elif _has_text(messages[index]):
            missing.append("query")
    first = next((k for k, m in enumerate(messages) if m["role"] != "system"), None)
    if first is not None:
        loc = found[first]
        if loc is not None:
            out.control_end = (loc.header if loc.anchored else loc.start) or None
        elif _has_text(messages[first]):
            missing.append("control")
    if out.has_trajectory and index is not None:
        after = found[index + 1]
        if out.query is not None:
            out.trajectory_start = out.query.end
        elif after is not None:
            out.trajectory_start = after.header
        elif _has_text(messages[index + 1]):
            missing.append("trajectory")
    if prefill_at is not None:
        out.live_start = prefill_at
    elif messages and found[-1] is not None:
        out.live_start = found[-1].start  # type: ignore[union-attr]
    elif messages and _has_text(messages[-1]):
        missing.append("live")
    out.unlocated = tuple(missing)
    return out
