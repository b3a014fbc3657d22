"""What a speculative step needs from the turn it runs in: a small decode interface.

The session implements it (`session.SpecTarget`); the spec step never sees the session, so
`spec` and `session` do not import each other.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from ..llama.context import LlamaContext
from ..trace import TurnStats


class DecodeTarget(Protocol):
    @property
    def ctx(self) -> LlamaContext: ...

    @property
    def n_ctx(self) -> int: ...

    @property
    def n_tokens(self) -> int:
        """Tokens in the cache: the next token's position."""
        ...

    def history(self) -> np.ndarray:
        """Every token of the conversation so far (host-store blocks included)."""
        ...

    def draft_room(self, stats: TurnStats, gen_start: int) -> int | None:
        """Make room for the next token as plain decoding would, and return the cells left
        for drafts (None: no limit, KVMem off)."""
        ...

    def note_decode(self) -> None: ...

    def accept(self, tokens: list[int], stats: TurnStats) -> None:
        """Record tokens now in the cache (the token and its accepted drafts)."""
        ...
