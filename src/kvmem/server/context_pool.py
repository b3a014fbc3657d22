"""`--kv-unified`: the lanes share one logical context of `-c` tokens.

Without it every lane's logical context is `-c / N` (llama-server's slots without a unified
KV cache). With it every lane may hold up to `-c` tokens (kvmem.engine.lanes sizes each
lane's context so), and this ledger keeps the running requests together within `-c`, as
llama-server's slots share one pool of `-c` cells. A request holds its context length
(prompt + tokens generated so far) from its `generate` call until its job ends; a lane
with no running request holds nothing (its kept history is its own context's and store's,
outside the pool). When a request cannot grow, it alone ends with
ContextPoolExhaustedError (llama-server's `500 Context size has been exceeded.`, which
there ends every running request); the others go on. The engine is wrapped here, in the
server (as kvmem.server.grammar_deadline does), so the engine stays unchanged.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from kvmem.errors import ContextPoolExhaustedError

logger = logging.getLogger(__name__)


class SharedContextPool:
    """How many tokens of the shared `-c` each lane's running request holds."""

    def __init__(self, n_ctx: int) -> None:
        self.n_ctx = n_ctx
        self._held: dict[int, int] = {}
        self._lock = threading.Lock()

    @property
    def used(self) -> int:
        with self._lock:
            return sum(self._held.values())

    def hold(self, lane: int, n_tokens: int) -> None:
        """Lane `lane`'s request now holds `n_tokens`; ContextPoolExhaustedError (and the
        holding unchanged) when that would take the lanes past `n_ctx`."""
        with self._lock:
            before = self._held.get(lane, 0)
            free = self.n_ctx - (sum(self._held.values()) - before)
            if n_tokens > free:
                raise ContextPoolExhaustedError(n_tokens - before, free - before, self.n_ctx)
            self._held[lane] = n_tokens

    def release(self, lane: int) -> None:
        with self._lock:
            self._held.pop(lane, None)

    def wrap(self, engine: Any, lane: int) -> Any:
        """`engine` whose generations hold their context length in this pool as `lane`."""
        return _PooledEngine(engine, self, lane)


class _PooledEngine:
    """The engine for one request on one lane; `generate` is counted, the rest passes."""

    __slots__ = ("_engine", "_pool", "_lane")

    def __init__(self, engine: Any, pool: SharedContextPool, lane: int) -> None:
        self._engine = engine
        self._pool = pool
        self._lane = lane

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def generate(self, prompt: Sequence[int], **kwargs: Any) -> Iterator[int]:
        self._pool.hold(self._lane, len(prompt))  # before the prompt is processed
        return self._counted(self._engine.generate(prompt, **kwargs), len(prompt))

    def _counted(self, tokens: Iterator[int], n_prompt: int) -> Iterator[int]:
        n = n_prompt
        try:
            for token in tokens:
                n += 1
                try:
                    self._pool.hold(self._lane, n)
                except ContextPoolExhaustedError:
                    logger.warning(
                        "lane %d stopped after %d tokens: the lanes' requests fill the shared "
                        "context of %d tokens (--kv-unified)",
                        self._lane,
                        n - 1 - n_prompt,
                        self._pool.n_ctx,
                    )
                    raise
                yield token
        finally:
            close = getattr(tokens, "close", None)
            if close is not None:
                close()
