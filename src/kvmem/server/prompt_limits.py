"""The character-count pre-check: a request that cannot fit `-c` is refused before any
template rendering or tokenization (which cost seconds and gigabytes for a 100 MB body).

A token covers at most `max_token_chars` characters (the longest token text of the
vocabulary, measured when the model loads), so a text of N characters has at least
N / max_token_chars tokens: when that lower bound already reaches `-c`, the exact count
cannot fit either. The exact check follows the single tokenization in the engine thread. Every route that
tokenizes (/completion, /v1/completions, /tokenize, /detokenize, /apply-template and the
input_tokens routes) runs the same pre-check, then its work in a worker thread.
"""

from __future__ import annotations

from typing import Any

from kvmem.chat.protocol import ModelInfoLike
from kvmem.errors import ContextLengthExceededError

PromptPart = str | list[int]


class PromptTooLongError(ContextLengthExceededError):
    """The character count alone proves the request is longer than -c."""

    def __init__(self, n_chars: int, min_tokens: int, n_ctx: int) -> None:
        super().__init__(min_tokens, n_ctx)
        self.args = (
            f"the request has {n_chars} characters, at least {min_tokens} tokens, "
            f"more than the context size of {n_ctx} tokens",
        )


def message_chars(messages: Any) -> int:
    """Characters of the text the messages contribute (content strings and text parts)."""
    total = 0
    for message in messages if isinstance(messages, list) else ():
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    total += len(part["text"])
    return total


def check_prompt_size(n_chars: int, info: ModelInfoLike) -> None:
    """PromptTooLongError when `n_chars` characters cannot fit the context."""
    per_token = int(getattr(info, "max_token_chars", 0) or 0)
    if per_token <= 0:
        return
    min_tokens = -(-n_chars // per_token)
    if min_tokens >= info.n_ctx:
        raise PromptTooLongError(n_chars, min_tokens, info.n_ctx)


def check_parts_size(parts: list[PromptPart], info: ModelInfoLike) -> None:
    """A prompt of text pieces and token ids: refused (PromptTooLongError, or
    ContextLengthExceededError for ids alone) when it cannot fit -c, before tokenization."""
    n_ids = sum(len(p) for p in parts if not isinstance(p, str))
    n_chars = sum(len(p) for p in parts if isinstance(p, str))
    if n_ids >= info.n_ctx:
        raise ContextLengthExceededError(n_ids, info.n_ctx)
    per_token = int(getattr(info, "max_token_chars", 0) or 0)
    if per_token > 0 and -(-n_chars // per_token) + n_ids >= info.n_ctx:
        raise PromptTooLongError(n_chars, -(-n_chars // per_token) + n_ids, info.n_ctx)


def check_id_count(n_ids: int, info: ModelInfoLike) -> None:
    """More token ids than -c holds (a /detokenize of millions of ids): refused."""
    if n_ids > info.n_ctx:
        raise ContextLengthExceededError(n_ids, info.n_ctx)
