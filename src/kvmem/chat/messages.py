"""Validating OpenAI chat messages and normalizing them for chat templates.

The result is what HF/llama.cpp templates expect: `content` a string (text parts joined
with newlines), assistant `tool_calls[*].function.arguments` a dict, `developer` folded
into `system`. Every problem raises `InvalidRequestError` naming the offending field.
"""

from __future__ import annotations

import base64
import binascii
import re
from enum import Enum
from typing import Any

from kvmem.chat.images import ImageCollector
from kvmem.chat.json_limits import loads_limited
from kvmem.errors import InvalidRequestError


class Role(Enum):
    SYSTEM = "system"
    DEVELOPER = "developer"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


_DATA_URL = re.compile(r"^data:image/(png|jpeg|jpg|gif|webp|bmp);base64,([A-Za-z0-9+/=\s]+)$", re.I)


def normalize_messages(
    raw: Any, *, vision: bool = False, images: ImageCollector | None = None
) -> list[dict[str, Any]]:
    """Validate `messages` and return template-ready copies. With `images` (a projector is
    loaded) each image part is decoded into it and its marker stands in the content."""
    if not isinstance(raw, list):
        raise InvalidRequestError("'messages' must be an array", "messages")
    if not raw:
        raise InvalidRequestError("'messages' must contain at least one message", "messages")
    return [_message(m, f"messages[{i}]", vision, images) for i, m in enumerate(raw)]


def last_user_index(messages: list[dict[str, Any]]) -> int | None:
    """Index of the last role=user message (the KVMem retrieval query), or None."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i]["role"] == Role.USER.value:
            return i
    return None


def _message(raw: Any, where: str, vision: bool, images: ImageCollector | None) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise InvalidRequestError(f"{where} must be an object", where)
    role_name = raw.get("role")
    if not isinstance(role_name, str):
        raise InvalidRequestError(f"{where}.role is required and must be a string", f"{where}.role")
    try:
        role = Role(role_name)
    except ValueError:
        allowed = ", ".join(r.value for r in Role)
        raise InvalidRequestError(
            f"{where}.role {role_name!r} is not one of {allowed}", f"{where}.role"
        ) from None
    if role is Role.DEVELOPER:
        role = Role.SYSTEM
    out: dict[str, Any] = {"role": role.value}
    has_calls = role is Role.ASSISTANT and raw.get("tool_calls") not in (None, [])
    content = raw.get("content")
    if content is None and role is not Role.ASSISTANT:
        raise InvalidRequestError(f"{where}.content is required", f"{where}.content")
    out["content"] = _content(content, f"{where}.content", vision, images)
    if role is Role.ASSISTANT and content is None and not has_calls:
        out["content"] = ""
    for key in ("name", "tool_call_id", "reasoning_content"):
        if key in raw and raw[key] is not None:
            if not isinstance(raw[key], str):
                raise InvalidRequestError(f"{where}.{key} must be a string", f"{where}.{key}")
            out[key] = raw[key]
    if has_calls:
        out["tool_calls"] = _tool_calls(raw["tool_calls"], f"{where}.tool_calls")
    return out


def _content(content: Any, where: str, vision: bool, images: ImageCollector | None) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequestError(f"{where} must be a string or an array of content parts", where)
    texts: list[str] = []
    for j, part in enumerate(content):
        at = f"{where}[{j}]"
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise InvalidRequestError(f"{at} must be an object with a 'type'", at)
        if part["type"] == "text":
            if not isinstance(part.get("text"), str):
                raise InvalidRequestError(f"{at}.text must be a string", f"{at}.text")
            texts.append(part["text"])
        elif part["type"] == "image_url" and images is not None:
            texts.append(images.add(part.get("image_url"), f"{at}.image_url"))
        elif part["type"] == "image_url":
            _check_image(part.get("image_url"), f"{at}.image_url")
            if not vision:
                raise InvalidRequestError(
                    "image input is not supported: no vision projector is loaded", at
                )
        else:
            raise InvalidRequestError(f"{at}.type {part['type']!r} is not supported", f"{at}.type")
    return "\n".join(texts)


def _check_image(image: Any, where: str) -> None:
    url = image.get("url") if isinstance(image, dict) else image
    if not isinstance(url, str) or not url:
        raise InvalidRequestError(f"{where}.url must be a non-empty string", where)
    if url.startswith(("http://", "https://")):
        raise InvalidRequestError(
            f"{where}: remote image URLs are not fetched; send a data: URL", where
        )
    match = _DATA_URL.match(url)
    if match is None:
        raise InvalidRequestError(f"{where} must be a data:image/...;base64, URL", where)
    try:
        data = base64.b64decode("".join(match.group(2).split()), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequestError(f"{where} has invalid base64 data", where) from None
    if not data:
        raise InvalidRequestError(f"{where} has no image data", where)


def _tool_calls(raw: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(raw, list):
        raise InvalidRequestError(f"{where} must be an array", where)
    calls = []
    for k, call in enumerate(raw):
        at = f"{where}[{k}]"
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise InvalidRequestError(f"{at}.function.name is required", f"{at}.function")
        args = fn.get("arguments", {})
        if isinstance(args, str):
            param = f"{at}.function.arguments"
            args = loads_limited(args, param, param) if args.strip() else {}
        if not isinstance(args, dict):
            raise InvalidRequestError(
                f"{at}.function.arguments must be a JSON object", f"{at}.function.arguments"
            )
        out: dict[str, Any] = {
            "type": "function",
            "function": {"name": fn["name"], "arguments": args},
        }
        if isinstance(call.get("id"), str):
            out["id"] = call["id"]
        calls.append(out)
    return calls
