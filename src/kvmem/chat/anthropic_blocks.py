"""Anthropic Messages API content blocks <-> chat messages.

`system` (a string or text blocks) becomes a system message. Each message's content (a
string or blocks) becomes OpenAI chat messages that the chat layer validates and renders:

- user: `text` blocks join into one user message; each `tool_result` becomes a `tool`
  message (placed first: it answers the assistant's preceding calls);
- assistant: `text` blocks become the content, `thinking` blocks the `reasoning_content`,
  `tool_use` blocks the `tool_calls`.

`cache_control` on a block is accepted (KVMem reuses every prefix on its own). Images,
documents, redacted thinking and server-tool blocks are refused, naming the block.
"""

from __future__ import annotations

import json
from typing import Any

from kvmem.chat.text_parts import joined_text
from kvmem.errors import InvalidRequestError

_BLOCK_KEYS = {
    "text": {"type", "text", "cache_control", "citations"},
    "thinking": {"type", "thinking", "signature"},
    "tool_use": {"type", "id", "name", "input", "cache_control"},
    "tool_result": {"type", "tool_use_id", "content", "is_error", "cache_control"},
}
_ALLOWED = {"user": ("text", "tool_result"), "assistant": ("text", "thinking", "tool_use")}


def system_text(raw: Any) -> str | None:
    if raw is None:
        return None
    return _texts(raw, "system")


def chat_messages(system: Any, messages: Any) -> list[dict[str, Any]]:
    """The chat messages of an Anthropic request's `system` and `messages`."""
    if not isinstance(messages, list) or not messages:
        raise InvalidRequestError("'messages' must be a non-empty array", "messages")
    out: list[dict[str, Any]] = []
    text = system_text(system)
    if text is not None:
        out.append({"role": "system", "content": text})
    for i, message in enumerate(messages):
        at = f"messages.{i}"
        if not isinstance(message, dict) or set(message) - {"role", "content"}:
            raise InvalidRequestError(f"{at} must be an object with role and content", at)
        role = message.get("role")
        if not isinstance(role, str) or role not in _ALLOWED:
            raise InvalidRequestError(f"{at}.role must be user or assistant", f"{at}.role")
        content = message.get("content")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        blocks = _blocks(content, f"{at}.content", _ALLOWED[role])
        out += _user(blocks, at) if role == "user" else [_assistant(blocks)]
    return out


def _blocks(content: Any, at: str, allowed: tuple[str, ...]) -> list[dict[str, Any]]:
    if not isinstance(content, list):
        raise InvalidRequestError(f"{at} must be a string or an array of content blocks", at)
    checked: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        where = f"{at}.{j}"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind not in allowed:
            raise InvalidRequestError(
                f"{where}.type {kind!r} is not supported here: use {', '.join(allowed)}",
                f"{where}.type",
            )
        extra = sorted(k for k in set(block) - _BLOCK_KEYS[kind] if block[k] is not None)
        if extra:
            raise InvalidRequestError(f"{where}.{extra[0]} is not supported", f"{where}.{extra[0]}")
        for key in ("text",) if kind == "text" else ("thinking",) if kind == "thinking" else ():
            if not isinstance(block.get(key), str):
                raise InvalidRequestError(f"{where}.{key} must be a string", f"{where}.{key}")
        if kind == "tool_use":
            for key in ("id", "name"):
                if not isinstance(block.get(key), str) or not block[key]:
                    raise InvalidRequestError(f"{where}.{key} must be a string", f"{where}.{key}")
            if not isinstance(block.get("input"), dict):
                raise InvalidRequestError(f"{where}.input must be an object", f"{where}.input")
        if kind == "tool_result" and not isinstance(block.get("tool_use_id"), str):
            raise InvalidRequestError(
                f"{where}.tool_use_id must be a string", f"{where}.tool_use_id"
            )
        if kind == "tool_result" and "content" in block:
            block = {**block, "content": _texts(block["content"], f"{where}.content")}
        checked.append(block)
    return checked


def _texts(raw: Any, at: str) -> str:
    return joined_text(
        raw, at, f"'{at}' must be a string or an array of text blocks", _text_block, _dotted
    )


def _text_block(block: Any, where: str) -> str:
    if not isinstance(block, dict) or block.get("type") != "text":
        raise InvalidRequestError(f"{where} must be a text block", f"{where}.type")
    extra = sorted(set(block) - _BLOCK_KEYS["text"])
    if extra:
        raise InvalidRequestError(f"{where}.{extra[0]} is not supported", f"{where}.{extra[0]}")
    if not isinstance(block.get("text"), str):
        raise InvalidRequestError(f"{where}.text must be a string", f"{where}.text")
    return block["text"]


def _dotted(at: str, j: int) -> str:
    return f"{at}.{j}"


def _user(blocks: list[dict[str, Any]], at: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    texts = []
    for block in blocks:
        if block["type"] == "tool_result":
            content = block.get("content", "")
            if block.get("is_error"):
                content = f"Error: {content}"
            out.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": content})
        else:
            texts.append(block["text"])
    if texts or not out:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _assistant(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    texts = [b["text"] for b in blocks if b["type"] == "text"]
    thinking = [b["thinking"] for b in blocks if b["type"] == "thinking"]
    calls = [
        {
            "id": b["id"],
            "type": "function",
            "function": {
                "name": b["name"],
                "arguments": json.dumps(b["input"], ensure_ascii=False),
            },
        }
        for b in blocks
        if b["type"] == "tool_use"
    ]
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
    if not calls and message["content"] is None:
        message["content"] = ""
    if thinking:
        message["reasoning_content"] = "\n".join(thinking)
    if calls:
        message["tool_calls"] = calls
    return message


def chat_tools(raw: Any) -> list[dict[str, Any]]:
    """Anthropic client tools (`name`, `description`, `input_schema`) as chat tools."""
    if not isinstance(raw, list):
        raise InvalidRequestError("'tools' must be an array", "tools")
    tools = []
    for i, tool in enumerate(raw):
        at = f"tools.{i}"
        if not isinstance(tool, dict):
            raise InvalidRequestError(f"{at} must be an object", at)
        if tool.get("type", "custom") != "custom":
            raise InvalidRequestError(
                f"{at}.type {tool['type']!r} is not supported: only client tools with an "
                "input_schema",
                f"{at}.type",
            )
        extra = sorted(set(tool) - {"type", "name", "description", "input_schema", "cache_control"})
        if extra:
            raise InvalidRequestError(f"{at}.{extra[0]} is not supported", f"{at}.{extra[0]}")
        if not isinstance(tool.get("input_schema"), dict):
            raise InvalidRequestError(
                f"{at}.input_schema is required and must be an object", f"{at}.input_schema"
            )
        function = {"name": tool.get("name"), "parameters": tool["input_schema"]}
        if "description" in tool:
            function["description"] = tool["description"]
        tools.append({"type": "function", "function": function})
    return tools


def chat_tool_choice(raw: Any) -> tuple[Any, bool | None]:
    """Anthropic `tool_choice` as the chat `tool_choice` and `parallel_tool_calls`."""
    if raw is None:
        return None, None
    kind = raw.get("type") if isinstance(raw, dict) else None
    keys = {"type", "disable_parallel_tool_use"} | ({"name"} if kind == "tool" else set())
    if kind not in ("auto", "any", "tool", "none") or set(raw) - keys:
        raise InvalidRequestError(
            "'tool_choice' must be {\"type\": auto | any | tool | none} (tool with a name)",
            "tool_choice",
        )
    parallel = raw.get("disable_parallel_tool_use")
    if parallel is not None and not isinstance(parallel, bool):
        raise InvalidRequestError(
            "'tool_choice.disable_parallel_tool_use' must be a boolean",
            "tool_choice.disable_parallel_tool_use",
        )
    allow_parallel = None if parallel is None else not parallel
    if kind == "tool":
        if not isinstance(raw.get("name"), str):
            raise InvalidRequestError("'tool_choice.name' must be a string", "tool_choice.name")
        return {"type": "function", "function": {"name": raw["name"]}}, allow_parallel
    return {"auto": "auto", "any": "required", "none": "none"}[kind], allow_parallel
