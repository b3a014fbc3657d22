"""Assistant prefill: a final assistant message is continued, as llama-server does.

The conversation without that message is rendered with the generation prompt and the
message's text is appended, so the model continues it. Text parts are joined with a
blank line (llama-server's rule). Two or more assistant messages at the end are
rejected, like llama-server. `continue_final_message` (vLLM/transformers) asks for the
same explicitly and excludes `add_generation_prompt: true`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvmem.errors import InvalidRequestError


@dataclass(frozen=True, slots=True)
class Prefill:
    messages: list[dict[str, Any]]  # the conversation to render
    text: str  # appended after the generation prompt ("" = none)
    add_generation_prompt: bool


def plan_prefill(
    raw_messages: list[Any],
    messages: list[dict[str, Any]],
    *,
    add_generation_prompt: bool | None = None,
    continue_final_message: bool | None = None,
) -> Prefill:
    if continue_final_message and add_generation_prompt:
        raise InvalidRequestError(
            "'continue_final_message' and 'add_generation_prompt' cannot both be true",
            "continue_final_message",
        )
    last = messages[-1]
    is_prefill = last["role"] == "assistant" and not last.get("tool_calls")
    if continue_final_message and not is_prefill:
        raise InvalidRequestError(
            "'continue_final_message' needs a final assistant message", "continue_final_message"
        )
    if not is_prefill:
        return Prefill(messages, "", add_generation_prompt is not False)
    if len(messages) >= 2 and messages[-2]["role"] == "assistant":
        raise InvalidRequestError(
            "Cannot have 2 or more assistant messages at the end of the list.", "messages"
        )
    content = raw_messages[-1].get("content")
    if isinstance(content, list):
        text = "\n\n".join(p.get("text", "") for p in content if p.get("type") == "text")
    else:
        text = content or ""
    return Prefill(messages[:-1], text, True)
