"""Tool calls while streaming: content flows through until a call starts, calls are emitted
as soon as their block is complete, and the stream says when the reply is complete.

States: TEXT (content flows; a call opener switches to CALLS), CALLS (the buffer holds a
call block until `next_block` finds it complete), AFTER (a call was emitted; the text
after it either opens another call or ends the reply), DONE (the reply is complete:
`done` is True, the turn stops generating, nothing more is emitted).

Rules (issue 29, as llama-server's tool grammar behaves): text before the first call is
content; text after the last complete call is never content; a call identical to an
earlier one ends the reply and is dropped; without `parallel` the first call ends it.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from kvmem.chat.stop import held_prefix_length
from kvmem.chat.tool_blocks import Follow, next_block, what_follows
from kvmem.chat.tool_calls import ToolCall, ToolFormat, call_key, parse_tool_calls, start_markers

StreamItem = str | ToolCall


class _State(Enum):
    TEXT = "text"
    CALLS = "calls"
    AFTER = "after"
    DONE = "done"


class ToolCallStream:
    """Feeds content text; yields content text and complete `ToolCall`s."""

    __slots__ = (
        "_fmt",
        "_tools",
        "_parallel",
        "_markers",
        "_held",
        "_buffer",
        "_state",
        "_emitted_text",
        "_seen",
        "n_calls",
        "cut_off",
    )

    def __init__(
        self, fmt: ToolFormat, tools: list[dict[str, Any]], *, parallel: bool = True
    ) -> None:
        self._fmt = fmt
        self._tools = tools
        self._parallel = parallel
        self._markers = start_markers(fmt)
        self._held = ""  # TEXT: a possible opener's beginning
        self._buffer = ""  # CALLS: the open block; AFTER: the text after the last call
        self._state = _State.TEXT
        self._emitted_text = False
        self._seen: set[tuple[str, str]] = set()
        self.n_calls = 0
        self.cut_off = False  # generation ended inside a call block that never completed

    @property
    def done(self) -> bool:
        """The reply is complete: generating more would only produce run-on text."""
        return self._state is _State.DONE

    def push(self, text: str) -> list[StreamItem]:
        if self._state is _State.DONE:
            return []
        if self._state is not _State.TEXT:
            self._buffer += text
            return self._advance()
        return self._push_text(text)

    def finish(self) -> list[StreamItem]:
        """What is left at the end of generation."""
        state, self._state = self._state, _State.DONE
        if state is _State.TEXT:
            held, self._held = self._held, ""
            return [held] if held.strip() or (held and self._emitted_text) else []
        rest, self._buffer = self._buffer, ""
        if state is not _State.CALLS or not rest.strip():
            return []
        parsed = parse_tool_calls(rest, self._fmt, self._tools)  # lenient: `</tool_ca`
        if not parsed.tool_calls:
            self.cut_off = True
            return [] if self.n_calls else [rest]
        items: list[StreamItem] = [parsed.content] if parsed.content and not self.n_calls else []
        return items + self._accept(parsed.tool_calls)

    def _push_text(self, text: str) -> list[StreamItem]:
        buffer = self._held + text
        self._held = ""
        if not self._emitted_text and not buffer.strip():
            self._held = buffer
            return []
        at = self._find_start(buffer)
        if at != -1:
            before = buffer[:at]
            keep_before = bool(before.strip()) or (self._emitted_text and bool(before))
            items: list[StreamItem] = [before] if keep_before else []
            self._emitted_text = self._emitted_text or bool(before.strip())
            self._state = _State.CALLS
            self._buffer = buffer[at:]
            return items + self._advance()
        keep = held_prefix_length(buffer, tuple(m for m in self._markers if len(m) > 1))
        emit = buffer[: len(buffer) - keep]
        self._held = buffer[len(buffer) - keep :]
        if emit.strip():
            self._emitted_text = True
        return [emit] if emit else []

    def _find_start(self, buffer: str) -> int:
        first = -1
        for marker in self._markers:
            at = buffer.find(marker)
            if at == -1:
                continue
            if marker in ("{", "```") and (self._emitted_text or buffer[:at].strip()):
                continue
            if first == -1 or at < first:
                first = at
        return first

    def _advance(self) -> list[StreamItem]:
        """Emit complete blocks and decide what follows them, as far as the buffer allows."""
        items: list[StreamItem] = []
        while True:
            if self._state is _State.AFTER:
                follow = what_follows(self._buffer, self._fmt, self._tools)
                if follow.kind is Follow.WAIT:
                    return items
                if follow.kind is Follow.END:
                    self._state, self._buffer = _State.DONE, ""
                    return items
                self._state, self._buffer = _State.CALLS, self._buffer[follow.start :]
            if self._state is not _State.CALLS:
                return items
            block = next_block(self._buffer, self._fmt, self._tools)
            if block is None:
                return items
            text, self._buffer = self._buffer[: block.end], self._buffer[block.end :]
            if not block.calls:
                return items + self._not_a_call(text)
            items += self._accept(block.calls)
            if self._state is _State.DONE or block.last:
                self._state, self._buffer = _State.DONE, ""
                return items
            self._state = _State.AFTER

    def _not_a_call(self, text: str) -> list[StreamItem]:
        """A block that parses as no call: content before any call, run-on after one."""
        if self.n_calls:
            self._state, self._buffer = _State.DONE, ""
            return []
        rest, self._buffer = self._buffer, ""
        self._state = _State.TEXT
        self._emitted_text = self._emitted_text or bool(text.strip())
        return [text, *self._push_text(rest)] if rest else [text]

    def _accept(self, calls: list[ToolCall]) -> list[StreamItem]:
        """New calls are emitted; a repeat of an earlier call, or any call after the first
        without `parallel`, ends the reply."""
        items: list[StreamItem] = []
        for call in calls:
            key = call_key(call)
            if key in self._seen:
                self._state = _State.DONE
                continue
            if self.n_calls and not self._parallel:
                self._state = _State.DONE
                break
            self._seen.add(key)
            items.append(call)
            self.n_calls += 1
        if self.n_calls and not self._parallel:
            self._state = _State.DONE
        return items
