"""Turn events -> the Anthropic Message object and its SSE events.

Streaming order: `message_start` (usage with the prompt's token count so far), `ping`,
then per content block `content_block_start`, `content_block_delta`... (`thinking_delta`,
`text_delta` or one `input_json_delta` with a call's whole arguments) and
`content_block_stop`, then `message_delta` (stop_reason, stop_sequence, the final usage)
and `message_stop`.

Usage follows Anthropic: `input_tokens` are the prompt tokens processed this turn,
`cache_read_input_tokens` the ones KVMem reused from the session.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any

from kvmem.chat.reasoning import Channel
from kvmem.chat.turn import ChatFinish, TextDelta, ToolCallEvent, TurnDone, TurnEvent, TurnUsage


def new_message_id() -> str:
    return "msg_" + secrets.token_hex(12)


def tool_use_id(call_id: str) -> str:
    return "toolu_" + call_id.removeprefix("call_")


def usage_body(usage: TurnUsage) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens - usage.cached_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": usage.cached_tokens,
        "output_tokens": usage.completion_tokens,
    }


def stop_reason(done: TurnDone) -> tuple[str, str | None]:
    if done.finish_reason is ChatFinish.TOOL_CALLS:
        return "tool_use", None
    if done.finish_reason is ChatFinish.LENGTH:
        return "max_tokens", None
    if done.stop_word:
        return "stop_sequence", done.stop_word
    return "end_turn", None


@dataclass(slots=True)
class MessageBuilder:
    model: str
    prompt_tokens: int = 0
    id: str = field(default_factory=new_message_id)
    content: list[dict[str, Any]] = field(default_factory=list)
    stop: tuple[str, str | None] | None = None
    usage: dict[str, Any] | None = None
    _open: str | None = None  # the type of the open text/thinking block
    _space: str = ""  # whitespace text held until real text follows

    def message(self) -> dict[str, Any]:
        reason, sequence = self.stop if self.stop is not None else (None, None)
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [dict(b) for b in self.content],
            "stop_reason": reason,
            "stop_sequence": sequence,
            "usage": self.usage or _start_usage(self.prompt_tokens),
        }

    def start(self) -> list[dict[str, Any]]:
        return [{"type": "message_start", "message": self.message()}, {"type": "ping"}]

    def push(self, event: TurnEvent) -> list[dict[str, Any]]:
        if isinstance(event, TextDelta):
            if event.channel is Channel.REASONING:
                return self._text("thinking", event.text)
            if self._open != "text" and not (self._space + event.text).strip():
                self._space += event.text
                return []
            text, self._space = self._space + event.text, ""
            return self._text("text", text)
        if isinstance(event, ToolCallEvent):
            return self._close() + self._tool_use(event)
        if isinstance(event, TurnDone):
            return self._done(event)
        return []

    def _text(self, kind: str, text: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if self._open != kind:
            events += self._close()
            block = {"type": kind, kind: ""}
            if kind == "thinking":
                block["signature"] = ""
            self.content.append(block)
            self._open = kind
            events.append(
                {
                    "type": "content_block_start",
                    "index": len(self.content) - 1,
                    "content_block": dict(block),
                }
            )
        self.content[-1][kind] += text
        delta = {"type": f"{kind}_delta", kind: text}
        events.append(
            {"type": "content_block_delta", "index": len(self.content) - 1, "delta": delta}
        )
        return events

    def _close(self) -> list[dict[str, Any]]:
        if self._open is None:
            return []
        self._open = None
        return [{"type": "content_block_stop", "index": len(self.content) - 1}]

    def _tool_use(self, event: ToolCallEvent) -> list[dict[str, Any]]:
        call = event.call
        block = {"type": "tool_use", "id": tool_use_id(call.id), "name": call.name, "input": {}}
        index = len(self.content)
        self.content.append({**block, "input": json.loads(call.arguments)})
        delta = {"type": "input_json_delta", "partial_json": call.arguments}
        return [
            {"type": "content_block_start", "index": index, "content_block": block},
            {"type": "content_block_delta", "index": index, "delta": delta},
            {"type": "content_block_stop", "index": index},
        ]

    def _done(self, done: TurnDone) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if self._space and not any(b["type"] == "tool_use" for b in self.content):
            events += self._text("text", self._space)
        self._space = ""
        events += self._close()
        self.stop = stop_reason(done)
        self.usage = usage_body(done.usage)
        delta = {"stop_reason": self.stop[0], "stop_sequence": self.stop[1]}
        return [
            *events,
            {"type": "message_delta", "delta": delta, "usage": dict(self.usage)},
            {"type": "message_stop"},
        ]


def _start_usage(prompt_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": prompt_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": 0,
    }
