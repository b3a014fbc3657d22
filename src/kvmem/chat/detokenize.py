"""Incremental detokenization: token ids in, complete UTF-8 text out.

A token's piece may end in the middle of a multi-byte character (byte-fallback tokens,
BPE pieces of CJK text or emoji). The incomplete bytes are held until the character is
complete, so streamed text never contains a broken character.
"""

from __future__ import annotations

import codecs
from typing import Protocol


class TokenPieces(Protocol):
    def token_bytes(self, token: int) -> bytes: ...


class IncrementalDetokenizer:
    """Turns a stream of token ids into text deltas."""

    __slots__ = ("_decoder", "_pieces", "_n_tokens")

    def __init__(self, pieces: TokenPieces) -> None:
        self._pieces = pieces
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._n_tokens = 0

    @property
    def n_tokens(self) -> int:
        return self._n_tokens

    def push(self, token: int) -> str:
        """The text completed by `token` (may be empty while a character is incomplete)."""
        self._n_tokens += 1
        return self._decoder.decode(self._pieces.token_bytes(token))

    def push_bytes(self, data: bytes) -> str:
        return self._decoder.decode(data)

    def flush(self) -> str:
        """Whatever is pending; an incomplete character becomes U+FFFD."""
        return self._decoder.decode(b"", final=True)
