"""Request bodies -> Python values: the chat layer's JSON limits (`kvmem.chat.json_limits`),
one set for bodies and for the JSON inside them (tool-call arguments)."""

from __future__ import annotations

from kvmem.chat.json_limits import MAX_DEPTH, MAX_INT_DIGITS, check_value, parse_json_body

__all__ = ["MAX_DEPTH", "MAX_INT_DIGITS", "check_value", "parse_json_body"]
