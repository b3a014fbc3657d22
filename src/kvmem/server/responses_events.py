"""Turn events -> the Responses API's Response object and its typed SSE events.

`ResponseBuilder` consumes one turn's events. Streaming, every call returns the events to
send, each with its `sequence_number`:

    response.created, response.in_progress,
    per output item, in order:
      reasoning: output_item.added, content_part.added, reasoning_text.delta...,
                 reasoning_text.done, content_part.done, output_item.done
      message:   output_item.added, content_part.added, output_text.delta...,
                 output_text.done, content_part.done, output_item.done
      call:      output_item.added, function_call_arguments.delta,
                 function_call_arguments.done, output_item.done
    response.completed (response.incomplete when max_output_tokens ended it).

Whitespace between tool calls opens no message item. Non-stream uses `response()` after
the turn.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from kvmem.chat.reasoning import Channel
from kvmem.chat.turn import ChatFinish, TextDelta, ToolCallEvent, TurnDone, TurnEvent


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(24)}"


@dataclass(slots=True)
class _Item:
    body: dict[str, Any]
    text: list[str] = field(default_factory=list)  # reasoning or output text so far


@dataclass(slots=True)
class ResponseBuilder:
    """One response; `echo` holds the request fields the Response object repeats."""

    model: str
    echo: dict[str, Any]
    id: str = field(default_factory=lambda: new_id("resp"))
    created_at: int = field(default_factory=lambda: int(time.time()))
    output: list[dict[str, Any]] = field(default_factory=list)
    sequence: int = 0
    status: str = "in_progress"
    usage: dict[str, Any] | None = None
    incomplete: dict[str, Any] | None = None
    _open: _Item | None = None
    _space: str = ""  # whitespace content held until real text follows

    def response(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": self.status,
            "error": None,
            "incomplete_details": self.incomplete,
            "model": self.model,
            "output": list(self.output),
            "usage": self.usage,
            **self.echo,
        }

    def start(self) -> list[dict[str, Any]]:
        return [
            self.numbered("response.created", response=self.response()),
            self.numbered("response.in_progress", response=self.response()),
        ]

    def push(self, event: TurnEvent) -> list[dict[str, Any]]:
        if isinstance(event, TextDelta):
            if event.channel is Channel.REASONING:
                return self._text("reasoning", event.text)
            if self._kind() != "message" and not (self._space + event.text).strip():
                self._space += event.text
                return []
            text, self._space = self._space + event.text, ""
            return self._text("message", text)
        if isinstance(event, ToolCallEvent):
            return self._close() + self._call(event)
        if isinstance(event, TurnDone):
            return self._done(event)
        return []  # token logprobs: not requested by this API

    # items --------------------------------------------------------------------------
    def _kind(self) -> str | None:
        return None if self._open is None else self._open.body["type"]

    def numbered(self, kind: str, **fields: Any) -> dict[str, Any]:
        body = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return body

    def _where(self, item: _Item) -> dict[str, Any]:
        return {"item_id": item.body["id"], "output_index": len(self.output)}

    def _text(self, kind: str, text: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if self._kind() != kind:
            events += self._close()
            events += self._open_item(kind)
        item = self._open
        assert item is not None
        item.text.append(text)
        name = (
            "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        )
        extra = {} if kind == "reasoning" else {"logprobs": []}
        events.append(
            self.numbered(name, **self._where(item), content_index=0, delta=text, **extra)
        )
        return events

    def _open_item(self, kind: str) -> list[dict[str, Any]]:
        if kind == "reasoning":
            body = {"id": new_id("rs"), "type": "reasoning", "summary": [], "content": []}
            part: dict[str, Any] = {"type": "reasoning_text", "text": ""}
        else:
            body = {"id": new_id("msg"), "type": "message", "role": "assistant", "content": []}
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        body["status"] = "in_progress"
        self._open = item = _Item(body)
        where = self._where(item)
        return [
            self.numbered(
                "response.output_item.added", output_index=where["output_index"], item=dict(body)
            ),
            self.numbered("response.content_part.added", **where, content_index=0, part=part),
        ]

    def _close(self, status: str = "completed") -> list[dict[str, Any]]:
        item, self._open = self._open, None
        if item is None:
            return []
        text = "".join(item.text)
        where = self._where(item)
        if item.body["type"] == "reasoning":
            part: dict[str, Any] = {"type": "reasoning_text", "text": text}
            done = self.numbered(
                "response.reasoning_text.done", **where, content_index=0, text=text
            )
        else:
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            done = self.numbered(
                "response.output_text.done", **where, content_index=0, text=text, logprobs=[]
            )
        body = {**item.body, "content": [part], "status": status}
        events = [
            done,
            self.numbered("response.content_part.done", **where, content_index=0, part=part),
            self.numbered(
                "response.output_item.done", output_index=where["output_index"], item=body
            ),
        ]
        self.output.append(body)
        return events

    def _call(self, event: ToolCallEvent) -> list[dict[str, Any]]:
        call = event.call
        body = {
            "id": new_id("fc"),
            "type": "function_call",
            "call_id": call.id,
            "name": call.name,
            "arguments": "",
            "status": "in_progress",
        }
        where = {"item_id": body["id"], "output_index": len(self.output)}
        events = [
            self.numbered(
                "response.output_item.added", output_index=where["output_index"], item=dict(body)
            ),
            self.numbered("response.function_call_arguments.delta", **where, delta=call.arguments),
            self.numbered(
                "response.function_call_arguments.done",
                **where,
                name=call.name,
                arguments=call.arguments,
            ),
        ]
        body = {**body, "arguments": call.arguments, "status": "completed"}
        events.append(
            self.numbered(
                "response.output_item.done", output_index=where["output_index"], item=body
            )
        )
        self.output.append(body)
        return events

    def _done(self, done: TurnDone) -> list[dict[str, Any]]:
        truncated = done.finish_reason is ChatFinish.LENGTH
        events: list[dict[str, Any]] = []
        if self._space and not any(i["type"] == "function_call" for i in self.output):
            events += self._text("message", self._space)  # whitespace is the whole answer
        self._space = ""
        events += self._close("incomplete" if truncated else "completed")
        u = done.usage
        self.usage = {
            "input_tokens": u.prompt_tokens,
            "input_tokens_details": {"cached_tokens": u.cached_tokens, "cache_write_tokens": 0},
            "output_tokens": u.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
            "total_tokens": u.prompt_tokens + u.completion_tokens,
        }
        if truncated:
            self.status = "incomplete"
            self.incomplete = {"reason": "max_output_tokens"}
            return [*events, self.numbered("response.incomplete", response=self.response())]
        self.status = "completed"
        return [*events, self.numbered("response.completed", response=self.response())]

    # the output as a chat message (for previous_response_id) -------------------------
    def output_parts(self) -> tuple[str, str, list[tuple[str, str, str]]]:
        """(content, reasoning, calls as (call_id, name, arguments))."""
        content, reasoning, calls = [], [], []
        for item in self.output:
            if item["type"] == "message":
                content.append(item["content"][0]["text"])
            elif item["type"] == "reasoning":
                reasoning.append(item["content"][0]["text"])
            else:
                calls.append((item["call_id"], item["name"], item["arguments"]))
        return "".join(content), "".join(reasoning), calls
