"""OpenAI Responses API items <-> chat messages.

The Responses API sends a conversation as `input`: a string (one user message) or a list
of items. Each item becomes an OpenAI chat message, which the chat layer then validates
and renders like any `/v1/chat/completions` request:

- `message` (also without `type`, as `{"role", "content"}`): role user, system, developer
  or assistant; content a string or `input_text` / `output_text` parts;
- `function_call` (`call_id`, `name`, `arguments`): a tool call of the assistant; calls in
  a row (and a preceding assistant message) form one assistant message;
- `function_call_output` (`call_id`, `output`): a `tool` message;
- `reasoning`: its `reasoning_text` content (else its summary) becomes the following
  assistant message's `reasoning_content`.

Anything else (images, files, item references, built-in tool items) is refused with an
InvalidRequestError naming the item.
"""

from __future__ import annotations

from typing import Any

from kvmem.chat.json_limits import loads_limited
from kvmem.chat.text_parts import joined_text
from kvmem.errors import InvalidRequestError

_ROLES = frozenset({"user", "system", "developer", "assistant"})
_TEXT_PARTS = frozenset({"input_text", "output_text"})


def input_messages(raw: Any, where: str = "input") -> list[dict[str, Any]]:
    """The chat messages of a Responses `input`."""
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}]
    if not isinstance(raw, list):
        raise InvalidRequestError(f"'{where}' must be a string or an array of items", where)
    if not raw:
        raise InvalidRequestError(f"'{where}' must contain at least one item", where)
    out: list[dict[str, Any]] = []
    reasoning: str | None = None
    for i, item in enumerate(raw):
        at = f"{where}[{i}]"
        if not isinstance(item, dict):
            raise InvalidRequestError(f"{at} must be an object", at)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            message = _message(item, at)
            if message["role"] == "assistant" and reasoning is not None:
                message["reasoning_content"], reasoning = reasoning, None
            out.append(message)
        elif kind == "function_call":
            call = _function_call(item, at)
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and reasoning is None:
                last.setdefault("tool_calls", []).append(call)
            else:
                message = {"role": "assistant", "content": None, "tool_calls": [call]}
                if reasoning is not None:
                    message["reasoning_content"], reasoning = reasoning, None
                out.append(message)
        elif kind == "function_call_output":
            out.append(_function_output(item, at))
        elif kind == "reasoning":
            reasoning = _reasoning_text(item, at)
        else:
            raise InvalidRequestError(
                f"{at}.type {kind!r} is not supported: send message, function_call, "
                "function_call_output or reasoning items",
                f"{at}.type",
            )
    return out


def _string(item: dict[str, Any], key: str, at: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise InvalidRequestError(f"{at}.{key} is required and must be a string", f"{at}.{key}")
    return value


def _text_parts(content: Any, at: str) -> str:
    return joined_text(
        content, at, f"{at} must be a string or an array of content parts", _text_part, _indexed
    )


def _text_part(part: Any, where: str) -> str:
    kind = part.get("type") if isinstance(part, dict) else None
    if not isinstance(kind, str) or kind not in _TEXT_PARTS:
        raise InvalidRequestError(
            f"{where}.type {kind!r} is not supported: only input_text and output_text parts",
            f"{where}.type",
        )
    if not isinstance(part.get("text"), str):
        raise InvalidRequestError(f"{where}.text must be a string", f"{where}.text")
    return part["text"]


def _indexed(at: str, j: int) -> str:
    return f"{at}[{j}]"


def _message(item: dict[str, Any], at: str) -> dict[str, Any]:
    role = item.get("role")
    if not isinstance(role, str) or role not in _ROLES:
        raise InvalidRequestError(
            f"{at}.role must be one of user, system, developer, assistant", f"{at}.role"
        )
    if "content" not in item:
        raise InvalidRequestError(f"{at}.content is required", f"{at}.content")
    return {"role": role, "content": _text_parts(item["content"], f"{at}.content")}


def _function_call(item: dict[str, Any], at: str) -> dict[str, Any]:
    arguments, where = item.get("arguments"), f"{at}.arguments"
    if not isinstance(arguments, str):
        raise InvalidRequestError(f"{where} must be a JSON string", where)
    if arguments.strip() and not isinstance(loads_limited(arguments, where, where), dict):
        raise InvalidRequestError(f"{where} must be a JSON object", where)
    return {
        "id": _string(item, "call_id", at),
        "type": "function",
        "function": {"name": _string(item, "name", at), "arguments": arguments},
    }


def _function_output(item: dict[str, Any], at: str) -> dict[str, Any]:
    if "output" not in item:
        raise InvalidRequestError(f"{at}.output is required", f"{at}.output")
    output = _text_parts(item["output"], f"{at}.output")
    return {"role": "tool", "tool_call_id": _string(item, "call_id", at), "content": output}


def _reasoning_text(item: dict[str, Any], at: str) -> str:
    for key, kind in (("content", "reasoning_text"), ("summary", "summary_text")):
        parts = item.get(key)
        if parts is None:
            continue
        if not isinstance(parts, list) or not all(
            isinstance(p, dict) and p.get("type") == kind and isinstance(p.get("text"), str)
            for p in parts
        ):
            raise InvalidRequestError(f"{at}.{key} must be an array of {kind} parts", f"{at}.{key}")
        if parts:
            return "\n".join(p["text"] for p in parts)
    return ""


def chat_tools(raw: Any, where: str = "tools") -> list[dict[str, Any]]:
    """Responses function tools (`{"type": "function", "name", ...}`) as chat tools."""
    if not isinstance(raw, list):
        raise InvalidRequestError(f"'{where}' must be an array", where)
    tools = []
    for i, tool in enumerate(raw):
        at = f"{where}[{i}]"
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise InvalidRequestError(
                f"{at}.type {kind!r} is not supported: only function tools", f"{at}.type"
            )
        extra = sorted(set(tool) - {"type", "name", "description", "parameters", "strict"})
        if extra:
            raise InvalidRequestError(f"{at}.{extra[0]} is not supported", f"{at}.{extra[0]}")
        function = {
            k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool
        }
        tools.append({"type": "function", "function": function})
    return tools


def chat_tool_choice(raw: Any) -> Any:
    """Responses `tool_choice` as the chat field."""
    if raw is None or raw in ("auto", "none", "required"):
        return raw
    if isinstance(raw, dict) and raw.get("type") == "function" and set(raw) <= {"type", "name"}:
        return {"type": "function", "function": {"name": raw.get("name")}}
    raise InvalidRequestError(
        '\'tool_choice\' must be auto, none, required or {"type": "function", "name": ...}',
        "tool_choice",
    )


def assistant_message(
    content: str, reasoning: str, calls: list[tuple[str, str, str]]
) -> dict[str, Any]:
    """The chat message of one response's output (call_id, name, arguments per call), kept
    for `previous_response_id`."""
    message: dict[str, Any] = {
        "role": "assistant",
        "content": content if content or not calls else None,
    }
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = [
            {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
            for cid, name, args in calls
        ]
    return message
