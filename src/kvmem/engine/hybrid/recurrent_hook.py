"""The turn's recurrent hook: `ReplaySSM` on a hybrid model, `NullRecurrent` otherwise.

The session calls the hook at the same points either way (a cut, a prefill chunk, the end
of a prefill and of a turn); on a model without recurrent state every call is a no-op, so
the turn has no hybrid branches of its own.
"""

from __future__ import annotations

from typing import Protocol

from kvmem.memory.spans import PromptSpans


class RecurrentHook(Protocol):
    active: bool  # the model has recurrent state (its prefill has checkpoints of its own)

    def plan_prefill(
        self, start: int, n: int, spans: PromptSpans, pin_tokens: int, block_tokens: int
    ) -> list[int]: ...

    def chunk_size(self, pos: int, size: int) -> int: ...

    def after_decode(self, end: int) -> None: ...

    def end_prefill(self) -> None: ...

    def take(self) -> None: ...

    def rewind_to(self, start: int) -> int: ...

    def clear(self) -> None: ...


class NullRecurrent:
    """No recurrent state: nothing to snapshot, every cut is where it was asked."""

    active = False

    def plan_prefill(
        self, start: int, n: int, spans: PromptSpans, pin_tokens: int, block_tokens: int
    ) -> list[int]:
        return []

    def chunk_size(self, pos: int, size: int) -> int:
        return size

    def after_decode(self, end: int) -> None:
        return None

    def end_prefill(self) -> None:
        return None

    def take(self) -> None:
        return None

    def rewind_to(self, start: int) -> int:
        return start

    def clear(self) -> None:
        return None
