"""Where a tool-call block ends while the output streams, and what may follow it.

llama-server constrains a tool call with a lazy grammar whose root is the call block
(`( call )+` with `parallel_tool_calls`, else one call): once the block is complete only
another call or the end of generation can follow. kvmem parses without that grammar, so
the stream asks these two questions instead:

- `next_block`: is the call block at the start of the buffer complete? Tagged formats end
  at their closing tag (`</tool_call>`, `</function>`); JSON forms (Hermes' bare JSON,
  Llama-3) when the top-level object closes; Mistral when its `[TOOL_CALLS]` array or the
  `[ARGS]` object closes.
- `what_follows`: after a complete block, does the text begin another call (the format's
  opener after whitespace), may it still (a prefix of one), or is it anything else (the
  reply is complete: generation stops and the text is not content)?
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import Enum
from typing import Any

from kvmem.chat.tool_calls import (
    ToolCall,
    ToolFormat,
    call_from_object,
    parse_tool_calls,
    tool_names,
)


@dataclass(slots=True)
class CallBlock:
    """A complete block at the start of the buffer: `end` is the index just past it.

    No `calls`: the block is not a call (invalid JSON in the tags, JSON that names no
    tool); its text is content when no call came before it."""

    end: int
    calls: list[ToolCall]
    last: bool = False  # the format allows no further call after it (Mistral's array)


class Follow(Enum):
    CALL = "call"  # another call begins at `start`
    WAIT = "wait"  # whitespace or the beginning of an opener: not decided yet
    END = "end"  # anything else: the reply is complete


@dataclass(slots=True)
class FollowResult:
    kind: Follow
    start: int = 0


_TAGGED_END = {"<tool_call>": "</tool_call>", "<function=": "</function>"}
_MISTRAL = "[TOOL_CALLS]"
_SEPARATORS = " \t\r\n,;"
_FENCE_HEAD = re.compile(r"```[A-Za-z0-9_-]*[ \t]*\n")


def next_block(buffer: str, fmt: ToolFormat, tools: list[dict[str, Any]]) -> CallBlock | None:
    """The complete call block `buffer` starts with, or None while it is not complete."""
    for opener, close in _TAGGED_END.items():
        if buffer.startswith(opener) and fmt in (ToolFormat.HERMES, ToolFormat.QWEN3_CODER):
            end = buffer.find(close)
            if end == -1:
                return None
            end += len(close)
            return CallBlock(end, parse_tool_calls(buffer[:end], fmt, tools).tool_calls)
    if fmt is ToolFormat.MISTRAL:
        return _mistral_block(buffer, tools)
    return _json_block(buffer, fmt, tools)


def _json_block(buffer: str, fmt: ToolFormat, tools: list[dict[str, Any]]) -> CallBlock | None:
    """A bare JSON call object (optionally after a code fence or `<|python_tag|>`)."""
    at = 0
    if buffer.startswith("```"):
        head = _FENCE_HEAD.match(buffer)
        if head is None:
            return None if "\n" not in buffer else CallBlock(len(buffer), [])
        at = head.end()
    elif buffer.startswith("<|python_tag|>"):
        at = len("<|python_tag|>")
    while at < len(buffer) and buffer[at].isspace():
        at += 1
    if at == len(buffer):
        return None
    if buffer[at] != "{":
        return CallBlock(len(buffer), [])
    decoded = _decode(buffer, at)
    if decoded is None:
        return None
    obj, end = decoded
    args_key = "parameters" if fmt is ToolFormat.LLAMA3_JSON else "arguments"
    call = call_from_object(obj, args_key)
    names = tool_names(tools)
    if (
        call is None
        or (names and call.name not in names)
        or (not names and fmt is ToolFormat.HERMES)
    ):
        return CallBlock(end, [])
    return CallBlock(end, [call])


def _mistral_block(buffer: str, tools: list[dict[str, Any]]) -> CallBlock | None:
    rest = buffer[len(_MISTRAL) :]
    at = len(buffer) - len(rest.lstrip())
    if at == len(buffer):
        return None
    if buffer[at] == "[":
        decoded = _decode(buffer, at)
        if decoded is None:
            return None
        end = decoded[1]
        return CallBlock(end, parse_tool_calls(buffer[:end], ToolFormat.MISTRAL).tool_calls, True)
    args = buffer.find("[ARGS]", at)
    if args == -1:
        return None
    start = args + len("[ARGS]")
    while start < len(buffer) and buffer[start].isspace():
        start += 1
    if start == len(buffer):
        return None
    decoded = _decode(buffer, start)
    if decoded is None:
        return None if buffer[start] == "{" else CallBlock(len(buffer), [])
    end = decoded[1]
    return CallBlock(end, parse_tool_calls(buffer[:end], ToolFormat.MISTRAL).tool_calls)


def _decode(text: str, at: int) -> tuple[Any, int] | None:
    """The JSON value starting at `at` and the index after it; None while it is unfinished
    (or invalid: the caller waits for the end of generation then)."""
    if "}" not in text[at:] and "]" not in text[at:]:
        return None
    try:
        return json.JSONDecoder().raw_decode(text, at)
    except json.JSONDecodeError:
        return None


def what_follows(tail: str, fmt: ToolFormat, tools: list[dict[str, Any]]) -> FollowResult:
    """After a complete call block: does `tail` begin another call in `fmt`?"""
    start = len(tail) - len(tail.lstrip(_SEPARATORS))
    rest = tail[start:]
    if not rest:
        return FollowResult(Follow.WAIT)
    literal = _literal_openers(fmt)
    if any(rest.startswith(o) for o in literal):
        return FollowResult(Follow.CALL, start)
    if fmt in (ToolFormat.HERMES, ToolFormat.LLAMA3_JSON):
        kind = _json_opener(rest, tool_names(tools))
        if kind is not Follow.END:
            return FollowResult(kind, start)
    if any(o.startswith(rest) for o in literal):
        return FollowResult(Follow.WAIT)
    return FollowResult(Follow.END)


def _literal_openers(fmt: ToolFormat) -> tuple[str, ...]:
    if fmt is ToolFormat.HERMES:
        return ("<tool_call>",)
    if fmt is ToolFormat.QWEN3_CODER:
        return ("<tool_call>", "<function=")
    if fmt is ToolFormat.MISTRAL:
        return (_MISTRAL,)
    return ("<|python_tag|>",)


def _json_opener(text: str, names: set[str]) -> Follow:
    """`{"name": "T"` with T a given tool (any name without tools), as llama-server's
    trigger pattern: CALL once it is there, WAIT while `text` may still become it."""
    compact = re.sub(r"\s+", "", text[:400])
    heads = ['{"name":"' + n + '"' for n in names] if names else ['{"name":"']
    if any(compact.startswith(h) for h in heads):
        return Follow.CALL
    if any(h.startswith(compact) for h in heads):
        return Follow.WAIT
    return Follow.END
