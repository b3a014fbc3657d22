"""The `POST /v1/responses` request: validated strictly, then translated into a chat request.

Fields we do not support are refused with a 400 naming them (pydantic `extra="forbid"`),
never ignored. The translation reuses `parse_chat_request`, so every chat check applies;
its error names are mapped back to the Responses names (`max_tokens` ->
`max_output_tokens`, `messages` -> `input`, ...).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kvmem.chat.response_items import chat_tool_choice, chat_tools, input_messages
from kvmem.chat.thinking import check_effort
from kvmem.errors import InvalidRequestError
from kvmem.server.api_validation import converted_chat_request, validate_body
from kvmem.server.kvmem_options import KVMemOptions, kvmem_field
from kvmem.server.schemas import MAX_TEMPERATURE, ChatCompletionRequest


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)


class ReasoningSpec(_Strict):
    effort: str | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None  # reasoning comes as content
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


class TextFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    description: str | None = None
    strict: bool | None = None


class TextSpec(_Strict):
    format: TextFormat | None = None
    verbosity: Literal["medium"] | None = None  # the only level a model without it has


class ResponsesRequest(_Strict):
    model: str | None = None
    input: str | list[Any]
    instructions: str | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=MAX_TEMPERATURE)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    reasoning: ReasoningSpec | None = None
    text: TextSpec | None = None
    store: bool = True
    previous_response_id: str | None = None
    stream: bool = False
    metadata: dict[str, str] | None = None
    kvmem: KVMemOptions | None = None  # KVMem's options (server/kvmem_options.py)
    user: str | None = None
    truncation: Literal["disabled"] | None = None
    include: list[Literal["reasoning.encrypted_content"]] | None = None  # nothing to encrypt


_PARAMS = {
    "messages": "input",
    "max_tokens": "max_output_tokens",
    "response_format": "text.format",
    "reasoning_effort": "reasoning.effort",
}


def parse_responses_request(body: Any) -> ResponsesRequest:
    return validate_body(ResponsesRequest, body, _describe)


def _describe(kind: str, param: str | None, message: str) -> str:
    if kind == "extra_forbidden":
        return f"'{param}' is not supported"
    return f"invalid '{param}': {message}"


def _rename(message: str, param: str | None) -> tuple[str, str | None]:
    """The chat request's field names as the Responses API's (`_PARAMS`)."""
    if param is not None:
        head, dot, rest = param.partition(".")
        head, bracket, index = head.partition("[")
        param = _PARAMS.get(head, head) + bracket + index + dot + rest
    for chat_name, name in _PARAMS.items():
        message = message.replace(f"'{chat_name}", f"'{name}")
    return message, param


def _response_format(text: TextSpec | None) -> dict[str, Any] | None:
    fmt = text.format if text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    if fmt.schema_ is None:
        raise InvalidRequestError("text.format.schema is required for json_schema", "text.format")
    spec: dict[str, Any] = {"name": fmt.name or "response", "schema": fmt.schema_}
    if fmt.strict is not None:
        spec["strict"] = fmt.strict
    return {"type": "json_schema", "json_schema": spec}


def request_messages(
    r: ResponsesRequest, previous: list[dict[str, Any]] | None
) -> list[dict[str, Any]]:
    """The conversation without instructions: the previous response's, then `input`."""
    return [*(previous or []), *input_messages(r.input)]


def chat_request(r: ResponsesRequest, conversation: list[dict[str, Any]]) -> ChatCompletionRequest:
    """The chat request that runs this response (instructions first, as a system message)."""
    messages = list(conversation)
    if r.reasoning is not None and r.reasoning.effort is not None:
        check_effort(r.reasoning.effort, "reasoning.effort")
    if r.instructions is not None:
        messages.insert(0, {"role": "system", "content": r.instructions})
    body: dict[str, Any] = {"messages": messages, "stream": False}
    if r.tools:
        body["tools"] = chat_tools(r.tools)
    if r.tool_choice is not None:
        body["tool_choice"] = chat_tool_choice(r.tool_choice)
    optional = {
        "parallel_tool_calls": r.parallel_tool_calls,
        "max_tokens": r.max_output_tokens,
        "temperature": r.temperature,
        "top_p": r.top_p,
        "reasoning_effort": r.reasoning.effort if r.reasoning else None,
        "response_format": _response_format(r.text),
        "user": r.user,
    }
    body.update({k: v for k, v in optional.items() if v is not None})
    body.update(kvmem_field(r.kvmem))
    return converted_chat_request(body, _rename)
