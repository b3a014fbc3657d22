"""Requests of `/completion` (llama-server's native API) and `/v1/completions` (OpenAI).

Both take one prompt or a batch. A prompt is text, token ids, a mix of the two in one
list, or llama-server's `{"prompt_string": ...}` object (`multimodal_data` is rejected:
no vision). Unsupported fields that would change the output get a 400 instead of being
ignored.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kvmem.errors import InvalidRequestError
from kvmem.server.kvmem_options import KVMemOptions
from kvmem.server.schemas import MAX_REPEAT_PENALTY, MAX_TEMPERATURE, _is_type_tag


class CompletionRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    prompt: Any = None
    model: str | None = None
    n_predict: int | None = None
    max_tokens: int | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=MAX_TEMPERATURE)
    top_k: int | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    repeat_penalty: float | None = Field(default=None, ge=0.0, le=MAX_REPEAT_PENALTY)
    repeat_last_n: int | None = Field(default=None, ge=-1)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    n_probs: int | None = Field(default=None, ge=0, le=100)
    post_sampling_probs: bool = False
    backend_sampling: bool = False  # llama-server's hint; the CPU chain samples either way
    logprobs: int | bool | None = None  # OpenAI completions: top-N log-probabilities
    cache_prompt: bool = True
    kvmem: KVMemOptions | None = None  # KVMem's options (server/kvmem_options.py)
    return_tokens: bool = False
    response_fields: list[str] | None = None
    ignore_eos: bool = False
    logit_bias: Any = None
    grammar: str | None = None
    json_schema: dict[str, Any] | None = None
    n: int | None = None
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None
    id_slot: int | None = None
    stream_options: dict[str, Any] | None = None
    timings_per_token: bool = False  # llama-server: `timings` on every stream chunk
    return_progress: bool = False  # llama-server: `prompt_progress` chunks (streams)

    @property
    def stop_list(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


PromptPart = str | list[int]


def parse_completion_request(body: Any) -> CompletionRequest:
    if not isinstance(body, dict):
        raise InvalidRequestError("the request body must be a JSON object")
    try:
        request = CompletionRequest.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"] if not _is_type_tag(p)) or None
        raise InvalidRequestError(f"invalid '{param}': {first['msg']}", param) from None
    _check(request)
    return request


def _check(r: CompletionRequest) -> None:
    if r.prompt is None:
        raise InvalidRequestError("'prompt' is required", "prompt")
    if r.n not in (None, 1):
        raise InvalidRequestError("only n=1 is supported (one KVMem session)", "n")
    if r.best_of not in (None, 1):
        raise InvalidRequestError("only best_of=1 is supported", "best_of")
    if r.echo:
        raise InvalidRequestError("'echo' is not supported", "echo")
    if r.suffix:
        raise InvalidRequestError("'suffix' (fill-in-the-middle) is not supported", "suffix")
    if r.grammar is not None and r.json_schema is not None:
        raise InvalidRequestError("give either 'grammar' or 'json_schema', not both", "grammar")
    if len(r.stop_list) > 16 or any(not s for s in r.stop_list):
        raise InvalidRequestError("'stop' must hold at most 16 non-empty strings", "stop")
    for name in ("n_predict", "max_tokens"):
        value = getattr(r, name)
        if value is not None and value != -1 and value < 0:
            raise InvalidRequestError(f"'{name}' must be >= 0 (or -1: the server's -n)", name)
    if (
        isinstance(r.logprobs, int)
        and not isinstance(r.logprobs, bool)
        and not 0 <= r.logprobs <= 20
    ):
        raise InvalidRequestError("'logprobs' must be between 0 and 20", "logprobs")


def prompt_parts(prompt: Any) -> list[list[PromptPart]]:
    """The batch of prompts, each a list of text pieces and token-id runs."""
    if isinstance(prompt, str | dict):
        return [_one(prompt)]
    if isinstance(prompt, list):
        if not prompt:
            raise InvalidRequestError("'prompt' must not be empty", "prompt")
        if all(isinstance(x, int) and not isinstance(x, bool) for x in prompt):
            return [[list(prompt)]]
        if any(isinstance(x, list | dict) for x in prompt):
            return [_one(x) for x in prompt]
        if all(isinstance(x, str) for x in prompt):
            return [[x] for x in prompt]
        return [_one(prompt)]  # one mixed sequence of ids and strings
    raise InvalidRequestError("'prompt' must be a string, token ids or a list of them", "prompt")


def _one(item: Any) -> list[PromptPart]:
    if isinstance(item, str):
        return [item]
    if isinstance(item, dict):
        if "multimodal_data" in item:
            raise InvalidRequestError(
                "multimodal prompts are not supported (no vision projector)", "prompt"
            )
        text = item.get("prompt_string")
        if not isinstance(text, str):
            raise InvalidRequestError("a prompt object needs a 'prompt_string' string", "prompt")
        return [text]
    if isinstance(item, list):
        parts: list[PromptPart] = []
        for x in item:
            if isinstance(x, bool) or not isinstance(x, int | str):
                raise InvalidRequestError("a prompt list holds token ids and strings", "prompt")
            if isinstance(x, str):
                parts.append(x)
            elif parts and isinstance(parts[-1], list):
                parts[-1].append(x)
            else:
                parts.append([x])
        return parts
    raise InvalidRequestError("'prompt' must be a string, token ids or a list of them", "prompt")
