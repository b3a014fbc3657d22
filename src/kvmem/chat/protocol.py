"""The parts of `kvmem.engine.engine.Engine` that the chat layer and the server call.

A `Protocol`, so unit tests can drive the chat layer and the server with a small fake
engine; the real `Engine` satisfies it structurally.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np


class ModelInfoLike(Protocol):
    """The fields of `kvmem.engine.llama.model.ModelInfo` that the chat layer reads."""

    @property
    def path(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def n_ctx(self) -> int: ...
    @property
    def n_ctx_train(self) -> int: ...
    @property
    def n_vocab(self) -> int: ...
    @property
    def chat_template(self) -> str | None: ...
    @property
    def bos_token_id(self) -> int: ...
    @property
    def eos_token_id(self) -> int: ...
    @property
    def bos_text(self) -> str: ...
    @property
    def eos_text(self) -> str: ...
    @property
    def add_bos(self) -> bool: ...


class TurnStatsLike(Protocol):
    """The fields of `kvmem.engine.trace.TurnStats` that the chat layer reads."""

    @property
    def prompt_tokens(self) -> int: ...
    @property
    def cached_tokens(self) -> int: ...
    @property
    def prefill_tokens(self) -> int: ...
    @property
    def prefill_ms(self) -> float: ...
    @property
    def generated_tokens(self) -> int: ...
    @property
    def decode_ms(self) -> float: ...
    @property
    def finish_reason(self) -> str: ...
    @property
    def replayed_tokens(self) -> int: ...
    @property
    def stage_in_blocks(self) -> int: ...
    @property
    def harvested_blocks(self) -> int: ...
    @property
    def truncated_tokens(self) -> int: ...
    @property
    def reselect_ms(self) -> float: ...


class ChatEngine(Protocol):
    """What kvmem-server and the chat layer need from an engine."""

    @property
    def info(self) -> ModelInfoLike: ...

    @property
    def last_turn(self) -> TurnStatsLike: ...

    @property
    def stats(self) -> Any: ...

    def tier_gauges(self) -> Mapping[str, int]: ...

    def tokenize(
        self, text: str, *, add_special: bool = False, parse_special: bool = True
    ) -> list[int]: ...

    def check_grammar(self, grammar: str) -> None: ...

    def detokenize(self, tokens: Sequence[int]) -> str: ...

    def token_bytes(self, token: int) -> bytes: ...

    def is_eog(self, token: int) -> bool: ...

    def generate(
        self,
        prompt: Sequence[int],
        *,
        query: Any = None,
        sampling: Any = None,
        max_tokens: int = -1,
        grammar: str | None = None,
        cancel: threading.Event | None = None,
        logits_out: list[np.ndarray] | None = None,
        ignore_eos: bool = False,
        banned_tokens: Sequence[int] = (),
        progress: Callable[[Any], None] | None = None,  # engine.trace.PrefillProgress
    ) -> Iterator[int]: ...

    def teacher_force(
        self, prompt: Sequence[int], continuation: Sequence[int], *, query: Any = None
    ) -> np.ndarray: ...

    def reset(self) -> None: ...

    def close(self) -> None: ...
