"""Tool calls while streaming: content flows through until a call starts, calls are emitted
as soon as they are complete, and whatever fails to parse is released as content."""

from __future__ import annotations

from typing import Any

from kvmem.chat.stop import held_prefix_length
from kvmem.chat.tool_calls import (
    ToolCall,
    ToolFormat,
    block_end,
    parse_tool_calls,
    start_markers,
)

StreamItem = str | ToolCall


class ToolCallStream:
    """Feeds content text; yields content text and complete `ToolCall`s."""

    __slots__ = (
        "_fmt",
        "_tools",
        "_markers",
        "_end",
        "_held",
        "_buffer",
        "_in_calls",
        "_emitted_text",
        "n_calls",
    )

    def __init__(self, fmt: ToolFormat, tools: list[dict[str, Any]]) -> None:
        self._fmt = fmt
        self._tools = tools
        self._markers = start_markers(fmt)
        self._end = block_end(fmt)
        self._held = ""
        self._buffer = ""
        self._in_calls = False
        self._emitted_text = False
        self.n_calls = 0

    def push(self, text: str) -> list[StreamItem]:
        if self._in_calls:
            self._buffer += text
            return self._drain()
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
            self._in_calls = True
            self._buffer = buffer[at:]
            return items + self._drain()
        keep = held_prefix_length(buffer, tuple(m for m in self._markers if len(m) > 1))
        emit = buffer[: len(buffer) - keep]
        self._held = buffer[len(buffer) - keep :]
        if emit.strip():
            self._emitted_text = True
        return [emit] if emit else []

    def finish(self) -> list[StreamItem]:
        """Parse what is left at the end of generation."""
        if not self._in_calls:
            held, self._held = self._held, ""
            return [held] if held.strip() or (held and self._emitted_text) else []
        rest, self._buffer = self._buffer, ""
        if not rest.strip():
            return []
        parsed = parse_tool_calls(rest, self._fmt, self._tools)
        items: list[StreamItem] = []
        if parsed.content:
            items.append(parsed.content)
        items.extend(parsed.tool_calls)
        self.n_calls += len(parsed.tool_calls)
        return items

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

    def _drain(self) -> list[StreamItem]:
        """Emit every complete call block in the buffer (formats with a closing tag)."""
        if self._end is None:
            return []
        items: list[StreamItem] = []
        while True:
            end = self._buffer.find(self._end)
            if end == -1:
                return items
            block = self._buffer[: end + len(self._end)]
            self._buffer = self._buffer[end + len(self._end) :]
            parsed = parse_tool_calls(block, self._fmt, self._tools)
            if parsed.content:
                items.append(parsed.content)
            items.extend(parsed.tool_calls)
            self.n_calls += len(parsed.tool_calls)
