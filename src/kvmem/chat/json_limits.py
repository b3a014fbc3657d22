"""JSON a client controls -> Python values, with one set of limits checked first.

Used for request bodies (`parse_json_body`, before pydantic sees them) and for JSON
inside them that is parsed again: tool-call `arguments` strings (`loads_limited`).
Both reject (InvalidRequestError, a 400) what would otherwise reach the
validators or the template as a crash: nesting deeper than MAX_DEPTH (json.loads itself
would raise RecursionError past ~1,000 levels), integer literals longer than
MAX_INT_DIGITS digits, floats that overflow to infinity (`1e999999`), the non-standard
constants `NaN`/`Infinity`, and lone UTF-16 surrogates (`"\\ud800"`) in any string or key,
which cannot be encoded as UTF-8. Lone surrogates are rejected, never replaced: the text a
client sent is either used exactly or refused.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from kvmem.errors import InvalidRequestError

MAX_DEPTH = 64  # arrays/objects inside each other, anywhere in the body
MAX_INT_DIGITS = 20  # an int64 has 19 digits
_SURROGATE = re.compile("[\ud800-\udfff]")


class _Reject(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _parse_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise _Reject(f"an integer has {digits} digits, more than {MAX_INT_DIGITS}")
    return int(text)


def _parse_float(text: str) -> float:
    if len(text) > 64:
        raise _Reject(f"a number literal has {len(text)} characters, more than 64")
    value = float(text)
    if not math.isfinite(value):
        raise _Reject(f"the number {text[:32]} is out of range")
    return value


def _parse_constant(name: str) -> float:
    raise _Reject(f"{name} is not valid JSON")


def parse_json_body(raw: bytes) -> Any:
    """Decode a JSON body; InvalidRequestError with a clear message on anything out of bounds."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequestError(f"the request body is not valid UTF-8: {exc}") from None
    return loads_limited(text, "the request body", None)


def loads_limited(text: str, what: str, param: str | None) -> Any:
    """`text` as JSON within the limits; InvalidRequestError(param) naming `what`."""
    if _SURROGATE.search(text):
        raise InvalidRequestError(
            f"{what} holds a lone UTF-16 surrogate (not valid Unicode text)", param
        )
    try:
        value = json.loads(
            text,
            parse_int=_parse_int,
            parse_float=_parse_float,
            parse_constant=_parse_constant,
        )
    except _Reject as exc:
        raise InvalidRequestError(f"{what} is not accepted: {exc.message}", param) from None
    except RecursionError:
        raise InvalidRequestError(
            f"{what} is nested too deeply (at most {MAX_DEPTH} levels)", param
        ) from None
    except (json.JSONDecodeError, ValueError) as exc:
        raise InvalidRequestError(f"{what} is not valid JSON: {exc}", param) from None
    check_value(value, what, param)
    return value


def check_value(value: Any, what: str = "the request body", param: str | None = None) -> None:
    """Depth and lone-surrogate checks over a decoded JSON value (iterative, no recursion)."""
    stack: list[tuple[Any, int, str]] = [(value, 1, "")]
    while stack:
        node, depth, path = stack.pop()
        if isinstance(node, str):
            if _SURROGATE.search(node):
                where = f" at '{path}'" if path else ""
                if param is not None:  # JSON inside a field: the field is the param
                    raise InvalidRequestError(
                        f"{what} holds a lone UTF-16 surrogate{where} (not valid Unicode text)",
                        param,
                    )
                raise InvalidRequestError(
                    f"a string{where} holds a lone UTF-16 surrogate (not valid Unicode text)",
                    path or None,
                )
            continue
        if not isinstance(node, (dict, list)):
            continue
        if depth > MAX_DEPTH:
            raise InvalidRequestError(
                f"{what} is nested too deeply at '{path[:200]}' (at most {MAX_DEPTH} levels)",
                param,
            )
        if isinstance(node, dict):
            for key, item in node.items():
                sub = f"{path}.{key}" if path else str(key)
                if _SURROGATE.search(key):
                    raise InvalidRequestError(
                        "an object key holds a lone UTF-16 surrogate (not valid Unicode text)",
                        param if param is not None else (path or None),
                    )
                stack.append((item, depth + 1, sub))
        else:
            stack.extend((item, depth + 1, f"{path}[{i}]") for i, item in enumerate(node))
