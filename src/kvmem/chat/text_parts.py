"""A message content that is a string or a list of text parts, as one string.

The Anthropic Messages API (text blocks, chat/anthropic_blocks.py) and the Responses API
(input_text/output_text parts, chat/response_items.py) both accept either form; each
checks its own parts (`part_text`) and words its own errors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvmem.errors import InvalidRequestError


def joined_text(
    raw: Any,
    at: str,
    not_a_list: str,
    part_text: Callable[[Any, str], str],
    where: Callable[[str, int], str],
) -> str:
    """`raw` itself when a string, else its parts' texts (`part_text(part, where(at, j))`)
    joined by newlines; `not_a_list`: the message when it is neither."""
    if isinstance(raw, str):
        return raw
    if not isinstance(raw, list):
        raise InvalidRequestError(not_a_list, at)
    return "\n".join(part_text(part, where(at, j)) for j, part in enumerate(raw))
