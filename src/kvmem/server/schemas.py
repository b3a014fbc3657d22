"""The `/v1/chat/completions` request schema (strict types: a string where a number belongs
is a 400, never silently coerced). Messages are validated by `kvmem.chat.messages`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from kvmem.errors import InvalidRequestError
from kvmem.server.kvmem_options import KVMemOptions

_FN_NAME = r"^[A-Za-z0-9_.:-]{1,64}$"


MAX_TEMPERATURE = 100.0  # finite bounds: 1e308 or inf would reach the sampler otherwise
MAX_REPEAT_PENALTY = 100.0
# template arguments the renderer sets itself: a client's value would collide with them
RESERVED_TEMPLATE_KWARGS = frozenset(
    {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"}
)


class _Strict(BaseModel):
    model_config = ConfigDict(
        strict=True, extra="ignore", populate_by_name=True, allow_inf_nan=False
    )


class ToolFunction(_Strict):
    name: str = Field(pattern=_FN_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Strict):
    type: Literal["function"]
    function: ToolFunction


class FunctionName(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: FunctionName


class StreamOptions(_Strict):
    include_usage: bool = False


class JsonSchemaSpec(_Strict):
    name: str | None = None
    schema_: dict[str, Any] | bool | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")  # llama-server extension

    @model_validator(mode="after")
    def _schema_present(self) -> ResponseFormat:
        if self.type == "json_schema" and (
            self.json_schema is None or self.json_schema.schema_ is None
        ):
            raise ValueError("json_schema.schema is required for type json_schema")
        return self


class ChatCompletionRequest(_Strict):
    model: str | None = None
    messages: list[Any]
    temperature: float | None = Field(default=None, ge=0.0, le=MAX_TEMPERATURE)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    repeat_penalty: float | None = Field(default=None, ge=0.0, le=MAX_REPEAT_PENALTY)
    seed: int | None = None
    stop: str | list[str] | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    n: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    reasoning_effort: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_budget_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    logit_bias: Any = None  # bans only (kvmem.server.logit_bias)
    grammar: str | None = None  # llama-server extension: a GBNF grammar
    json_schema: dict[str, Any] | None = None  # llama-server extension
    user: str | None = None
    add_generation_prompt: bool | None = None  # llama-server/vLLM extension
    continue_final_message: bool | None = None  # vLLM: continue the final assistant message
    verbose: bool | None = None  # llama-server: add `__verbose` with the rendered prompt
    ignore_eos: bool | None = None  # llama-server extension: never stop at end-of-generation
    timings_per_token: bool | None = None  # llama-server: `timings` on every stream chunk
    return_progress: bool | None = None  # llama-server: `prompt_progress` chunks (streams)
    backend_sampling: bool | None = None  # llama-server's hint; the CPU chain samples either way
    kvmem: KVMemOptions | None = None  # KVMem's options (server/kvmem_options.py)

    @property
    def stop_list(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def tool_dicts(self) -> list[dict[str, Any]]:
        return [t.model_dump(exclude_none=True, by_alias=True) for t in self.tools or []]


def parse_chat_request(body: Any) -> ChatCompletionRequest:
    """Validate a decoded JSON body; InvalidRequestError names the first bad field."""
    if not isinstance(body, dict):
        raise InvalidRequestError("the request body must be a JSON object")
    try:
        request = ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"] if not _is_type_tag(p)) or None
        raise InvalidRequestError(f"invalid '{param}': {first['msg']}", param) from None
    _check_semantics(request)
    return request


_TYPE_TAGS = {"str", "int", "float", "bool", "dict", "list", "none"}


def _is_type_tag(part: object) -> bool:
    """pydantic puts union member names ('str', 'list[str]', 'NamedToolChoice') in error locations."""
    if not isinstance(part, str):
        return False
    return part in _TYPE_TAGS or "[" in part or part[:1].isupper()


def _check_semantics(request: ChatCompletionRequest) -> None:
    for name in ("max_tokens", "max_completion_tokens"):
        value = getattr(request, name)
        if value is not None and value != -1 and value < 0:
            raise InvalidRequestError(
                f"'{name}' must be >= 0 (0: prefill only) or -1 (the server's -n)", name
            )
    if request.n is not None and not 1 <= request.n <= 8:
        raise InvalidRequestError("'n' must be between 1 and 8", "n")
    if request.top_logprobs is not None and not request.logprobs:
        raise InvalidRequestError("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    constraints = [
        name
        for name in ("grammar", "json_schema", "response_format")
        if getattr(request, name) is not None
        and not (name == "response_format" and request.response_format.type == "text")  # type: ignore[union-attr]
    ]
    if len(constraints) > 1:
        raise InvalidRequestError(
            f"give one of {', '.join(constraints)}, not several", constraints[0]
        )
    if len(request.stop_list) > 16 or any(not s for s in request.stop_list):
        raise InvalidRequestError("'stop' must hold at most 16 non-empty strings", "stop")
    if request.reasoning_budget_tokens is not None and request.reasoning_budget_tokens < -1:
        raise InvalidRequestError(
            "'reasoning_budget_tokens' must be -1 (unlimited), 0 or a positive integer",
            "reasoning_budget_tokens",
        )
    if request.stream_options is not None and not request.stream:
        raise InvalidRequestError(
            "'stream_options' is only allowed with stream=true", "stream_options"
        )
    reserved = sorted(RESERVED_TEMPLATE_KWARGS & set(request.chat_template_kwargs or {}))
    if reserved:
        raise InvalidRequestError(
            f"'chat_template_kwargs' may not set {', '.join(reserved)}: the server sets it",
            "chat_template_kwargs",
        )
    choice = request.tool_choice
    if choice is not None and choice != "none" and choice != "auto" and not request.tools:
        raise InvalidRequestError("'tool_choice' needs 'tools'", "tool_choice")
    if isinstance(choice, NamedToolChoice):
        names = {t.function.name for t in request.tools or []}
        if choice.function.name not in names:
            raise InvalidRequestError(
                f"tool_choice names {choice.function.name!r}, which is not in 'tools'",
                "tool_choice",
            )
