"""The Anthropic `POST /v1/messages` request, validated strictly and translated into a chat
request (so every chat check, the template and the tool grammars apply).

Unsupported fields are refused with a 400 naming them. `metadata` (its `user_id`) and a
top-level `cache_control` are accepted and change nothing. `thinking` maps to the
reasoning controls: `enabled` turns the template's thinking on with `budget_tokens` as the
reasoning budget, `adaptive` turns it on without a budget, `disabled` turns it off.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kvmem.chat.anthropic_blocks import chat_messages, chat_tool_choice, chat_tools
from kvmem.errors import InvalidRequestError
from kvmem.server.api_validation import converted_chat_request, validate_body
from kvmem.server.kvmem_options import KVMemOptions, kvmem_field
from kvmem.server.schemas import ChatCompletionRequest


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)


class Metadata(_Strict):
    user_id: str | None = None


class CacheControl(_Strict):
    type: Literal["ephemeral"]
    ttl: str | None = None


class Thinking(_Strict):
    type: Literal["enabled", "adaptive", "disabled"]
    budget_tokens: int | None = Field(default=None, ge=1)


class MessagesRequest(_Strict):
    model: str
    messages: list[Any]
    max_tokens: int = Field(ge=1)
    system: str | list[Any] | None = None
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    tools: list[Any] | None = None
    tool_choice: Any = None
    thinking: Thinking | None = None
    metadata: Metadata | None = None
    cache_control: CacheControl | None = None  # KVMem reuses every prefix on its own
    kvmem: KVMemOptions | None = None  # KVMem's options (server/kvmem_options.py)


class CountTokensRequest(_Strict):
    model: str
    messages: list[Any]
    system: str | list[Any] | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    thinking: Thinking | None = None


def _describe(kind: str, param: str | None, message: str) -> str:
    if kind == "extra_forbidden":
        return f"{param}: Extra inputs are not permitted"
    if kind == "missing":
        return f"{param}: Field required"
    return f"{param}: {message}"


def _rename(message: str, param: str | None) -> tuple[str, str | None]:
    """The chat request's `stop` is Anthropic's `stop_sequences`."""
    param = "stop_sequences" if param == "stop" else param
    return message.replace("'stop'", "'stop_sequences'"), param


def parse_messages_request(body: Any) -> MessagesRequest:
    return validate_body(MessagesRequest, body, _describe)


def parse_count_request(body: Any) -> CountTokensRequest:
    return validate_body(CountTokensRequest, body, _describe)


def chat_request(r: MessagesRequest | CountTokensRequest) -> ChatCompletionRequest:
    """The chat request that runs (or counts) this message."""
    body: dict[str, Any] = {"messages": chat_messages(r.system, r.messages), "stream": False}
    if r.tools:
        body["tools"] = chat_tools(r.tools)
    choice, parallel = chat_tool_choice(r.tool_choice)
    if choice is not None:
        body["tool_choice"] = choice
    if parallel is not None:
        body["parallel_tool_calls"] = parallel
    elif r.tools:
        body["parallel_tool_calls"] = True  # Anthropic's default
    if r.thinking is not None:
        enabled = r.thinking.type != "disabled"
        body["chat_template_kwargs"] = {"enable_thinking": enabled}
        if enabled and r.thinking.budget_tokens is not None:
            body["reasoning_budget_tokens"] = r.thinking.budget_tokens
    if isinstance(r, MessagesRequest):
        budget = r.thinking.budget_tokens if r.thinking is not None else None
        if budget is not None and budget >= r.max_tokens:
            raise InvalidRequestError(
                "thinking.budget_tokens must be less than max_tokens", "thinking.budget_tokens"
            )
        optional = {
            "max_tokens": r.max_tokens,
            "stop": r.stop_sequences or None,
            "temperature": r.temperature,
            "top_p": r.top_p,
            "top_k": r.top_k,
        }
        body.update({k: v for k, v in optional.items() if v is not None})
        body.update(kvmem_field(r.kvmem))
    return converted_chat_request(body, _rename)
