"""Request-body validation the Responses and Anthropic Messages schemas share.

Each API validates its body with its own pydantic model and converts it into a chat
request; both report the first problem as an `InvalidRequestError` whose message and
`param` use that API's own field names (each module passes its wording and renaming).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from kvmem.errors import InvalidRequestError
from kvmem.server.schemas import ChatCompletionRequest, parse_chat_request

M = TypeVar("M", bound=BaseModel)

# (pydantic error type, param, pydantic message) -> the API's message
Describe = Callable[[str, str | None, str], str]
# the chat request's error (message, param) -> the API's (message, param)
Rename = Callable[[str, str | None], tuple[str, str | None]]


def validate_body(model: type[M], body: Any, describe: Describe) -> M:
    """`body` as `model`; its first validation error, worded by `describe`, as a 400."""
    if not isinstance(body, dict):
        raise InvalidRequestError("the request body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"] if _is_field(p)) or None
        raise InvalidRequestError(describe(first["type"], param, first["msg"]), param) from None


def converted_chat_request(body: dict[str, Any], rename: Rename) -> ChatCompletionRequest:
    """The chat request `body`; its validation error in the API's names (`rename`)."""
    try:
        return parse_chat_request(body)
    except InvalidRequestError as exc:
        message, param = rename(str(exc), exc.param)
        raise InvalidRequestError(message, param) from None


def _is_field(part: object) -> bool:
    """Whether a pydantic error location part names a field (not a union member's type)."""
    return isinstance(part, int) or (
        isinstance(part, str) and part not in ("str", "list[any]") and "[" not in part
    )
