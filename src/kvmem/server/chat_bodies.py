"""OpenAI chat-completion bodies: the non-stream response and the SSE chunks.

Stream order: a `role` delta, then `content` / `reasoning_content` deltas and tool-call
deltas (per call: a first delta with index, id, type and name, then the arguments), then
a chunk with `finish_reason` (carrying `timings` and the turn's `kvmem` memory object,
as the non-stream body does), then (with `stream_options.include_usage`) a usage chunk
with empty `choices`, then `data: [DONE]`.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from kvmem.chat.reasoning import Channel
from kvmem.chat.turn import (
    ChatFinish,
    TextDelta,
    TokenLogprobs,
    ToolCallEvent,
    TurnDone,
    TurnEvent,
    TurnUsage,
)
from kvmem.server.props import system_fingerprint
from kvmem.server.sse import sse_data


def finish_name(finish: ChatFinish) -> str:
    return "stop" if finish is ChatFinish.CANCELLED else finish.value


def usage_body(usage: TurnUsage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "prompt_cache_hit_tokens": usage.cached_tokens,
        "prompt_cache_miss_tokens": usage.prompt_tokens - usage.cached_tokens,
    }


def timings_body(usage: TurnUsage) -> dict[str, Any]:
    """llama-server's `timings`. The first generated token comes from the prompt's logits,
    so the generation rate is over the n - 1 decode steps (as llama-server counts it)."""
    prompt_n = usage.prompt_tokens - usage.cached_tokens
    predicted_n = usage.completion_tokens
    steps = max(0, predicted_n - 1)
    prompt_ms, predicted_ms = round(usage.prefill_ms, 3), round(usage.decode_ms, 3)
    return {
        "cache_n": usage.cached_tokens,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n > 0 else 0.0,
        "prompt_per_second": prompt_n / (prompt_ms / 1e3) if prompt_ms > 0 else 0.0,
        "predicted_n": predicted_n,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / steps if steps and predicted_ms > 0 else 0.0,
        "predicted_per_second": steps / (predicted_ms / 1e3) if steps and predicted_ms > 0 else 0.0,
        # llama-server adds the draft counts when speculative decoding drafted
        **(
            {"draft_n": mem.draft_n, "draft_n_accepted": mem.draft_n_accepted}
            if (mem := usage.memory).draft_n
            else {}
        ),
    }


def _lp(piece: bytes, logprob: float) -> dict[str, Any]:
    return {
        "token": piece.decode("utf-8", "replace"),
        "logprob": logprob if logprob > float("-inf") else -9999.0,
        "bytes": list(piece),
    }


def logprob_entry(event: TokenLogprobs) -> dict[str, Any]:
    """One token of OpenAI's `choices[].logprobs.content`."""
    entry = _lp(event.piece, event.logprob)
    entry["top_logprobs"] = [_lp(piece, lp) for _, piece, lp in event.top]
    return entry


def tool_call_body(event: ToolCallEvent) -> dict[str, Any]:
    call = event.call
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


@dataclass(slots=True)
class CompletionAccumulator:
    """Collects turn events into the non-stream response."""

    model: str
    id: str = field(default_factory=lambda: "chatcmpl-" + secrets.token_hex(12))
    created: int = field(default_factory=lambda: int(time.time()))
    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    logprobs: list[dict[str, Any]] | None = None
    done: TurnDone | None = None
    block_tokens: int = 0  # KVMem block size: the `kvmem` object's retrieved_tokens

    def add(self, event: TurnEvent) -> None:
        if isinstance(event, TokenLogprobs):
            self.logprobs = (self.logprobs or []) + [logprob_entry(event)]
        elif isinstance(event, TextDelta):
            (self.reasoning if event.channel is Channel.REASONING else self.content).append(
                event.text
            )
        elif isinstance(event, ToolCallEvent):
            self.tool_calls.append(tool_call_body(event))
        else:
            self.done = event

    def body(self) -> dict[str, Any]:
        assert self.done is not None, "a turn always ends with TurnDone"
        content = "".join(self.content)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if self.tool_calls:
            message["content"] = content.strip() or None
            message["tool_calls"] = self.tool_calls
        if self.reasoning:
            message["reasoning_content"] = "".join(self.reasoning)
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": system_fingerprint(),
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None if self.logprobs is None else {"content": self.logprobs},
                    "finish_reason": finish_name(self.done.finish_reason),
                }
            ],
            "usage": usage_body(self.done.usage),
            "timings": timings_body(self.done.usage),
            "kvmem": self.done.usage.memory.body(self.block_tokens),
        }


@dataclass(slots=True)
class ChunkWriter:
    """Formats turn events as SSE `data:` lines."""

    model: str
    include_usage: bool = False
    block_tokens: int = 0  # KVMem block size: the `kvmem` object's retrieved_tokens
    id: str = field(default_factory=lambda: "chatcmpl-" + secrets.token_hex(12))
    created: int = field(default_factory=lambda: int(time.time()))
    pending_logprobs: list[dict[str, Any]] = field(default_factory=list)
    live_timings: dict[str, Any] | None = None  # timings_per_token: on every later chunk

    def _chunk(
        self,
        delta: dict[str, Any] | None,
        finish: str | None = None,
        logprobs: dict[str, Any] | None = None,
        **extra: Any,
    ) -> str:
        body: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": system_fingerprint(),
            "choices": []
            if delta is None
            else [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
        }
        if self.live_timings is not None:
            body["timings"] = self.live_timings
        body.update(extra)  # the final chunks' exact timings replace the live ones
        return sse_data(body)

    def role(self) -> str:
        return self._chunk({"role": "assistant", "content": None})

    def progress(self, body: dict[str, int], timings: dict[str, Any] | None = None) -> str:
        """A return_progress chunk: a role delta with `prompt_progress` (and `timings` with
        timings_per_token), as llama-server's."""
        extra = {"timings": timings} if timings is not None else {}
        return self._chunk({"role": "assistant", "content": None}, prompt_progress=body, **extra)

    def event(self, event: TurnEvent) -> list[str]:
        if isinstance(event, TokenLogprobs):  # sent with the next text delta
            self.pending_logprobs.append(logprob_entry(event))
            return []
        if isinstance(event, TextDelta):
            return [self._chunk({event.channel.value: event.text}, logprobs=self._logprobs())]
        if isinstance(event, ToolCallEvent):
            call = tool_call_body(event)
            head = {
                "index": event.index,
                "id": call["id"],
                "type": "function",
                "function": {"name": call["function"]["name"], "arguments": ""},
            }
            args = {"index": event.index, "function": {"arguments": call["function"]["arguments"]}}
            return [self._chunk({"tool_calls": [head]}), self._chunk({"tool_calls": [args]})]
        timings = timings_body(event.usage)
        out = [
            self._chunk(
                {},
                finish_name(event.finish_reason),
                logprobs=self._logprobs(),
                timings=timings,
                kvmem=event.usage.memory.body(self.block_tokens),
            )
        ]
        if self.include_usage:
            out.append(self._chunk(None, usage=usage_body(event.usage), timings=timings))
        return out

    def _logprobs(self) -> dict[str, Any] | None:
        if not self.pending_logprobs:
            return None
        entries, self.pending_logprobs = self.pending_logprobs, []
        return {"content": entries}


def merge_choices(bodies: list[dict[str, Any]]) -> dict[str, Any]:
    """n > 1: one response whose choices are the runs' in order, usage summed."""
    if len(bodies) == 1:
        return bodies[0]
    out = dict(bodies[0])
    out["choices"] = [{**b["choices"][0], "index": i} for i, b in enumerate(bodies)]
    usage = dict(out["usage"])
    for key in ("completion_tokens", "total_tokens"):
        usage[key] = sum(b["usage"][key] for b in bodies)
    out["usage"] = usage
    return out
