"""Prompts given as text pieces and token ids, tokenized (/completion, /tokenize).

A prompt is a list of parts (server/completion_schema.py's `prompt_parts`): a text piece
is tokenized with special tokens parsed, as llama-server does; token ids are checked
against the vocabulary and kept.
"""

from __future__ import annotations

from typing import Any

from kvmem.chat.protocol import ChatEngine
from kvmem.errors import InvalidRequestError
from kvmem.server.completion_schema import PromptPart


def check_ids(parts: list[Any], n_vocab: int, param: str) -> None:
    """InvalidRequestError naming the first token id outside the vocabulary."""
    for part in parts:
        if isinstance(part, str):
            continue
        bad = [t for t in part if not 0 <= t < n_vocab]
        if bad:
            raise InvalidRequestError(
                f"token id {bad[0]} is out of range (vocabulary of {n_vocab})", param
            )


def tokenize_parts(vocab: ChatEngine, parts: list[PromptPart]) -> list[int]:
    """Text pieces tokenized (BOS before a leading text, as llama.cpp adds it), ids kept."""
    info = vocab.info
    check_ids(parts, info.n_vocab, "prompt")
    tokens: list[int] = []
    for i, part in enumerate(parts):
        if isinstance(part, str):
            text = part
            if i == 0 and info.add_bos:
                if info.bos_text and text.startswith(info.bos_text):
                    text = text[len(info.bos_text) :]
                tokens.append(info.bos_token_id)
            tokens += vocab.tokenize(text, add_special=False, parse_special=True)
        else:
            tokens += part
    if not tokens:
        raise InvalidRequestError("the prompt is empty", "prompt")
    return tokens


def plain_tokens(vocab: ChatEngine, parts: list[Any]) -> list[int]:
    """Text pieces tokenized without BOS, ids kept (/tokenize without add_special)."""
    tokens: list[int] = []
    for part in parts:
        if isinstance(part, str):
            tokens += vocab.tokenize(part, add_special=False, parse_special=True)
        else:
            tokens += part
    return tokens
