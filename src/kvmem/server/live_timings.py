"""`timings_per_token`: llama-server's `timings` on every streamed chunk, not just the last.

`TimingProbe.wrap(engine)` returns the engine with its `generate` observed: the time of
the call, of the first token (the prompt is processed by then) and of each later token.
The worker sends a `TimingsSnapshot` after each event; the stream writers put its body on
the next chunk. The final chunk keeps the exact `timings` of the finished turn.

The split of the prompt into reused (`cache_n`) and processed (`prompt_n`) tokens comes
from the engine's `live_turn` (the statistics of the turn being generated) when it has
one; without it, per-token chunks carry the generation fields and `prompt_ms` only.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class TimingsSnapshot:
    """The `timings` object for the chunks that follow (worker -> route)."""

    body: dict[str, Any]


class TimingProbe:
    __slots__ = ("started", "first_token", "last_token", "n_tokens", "live")

    def __init__(self) -> None:
        self.started: float | None = None
        self.first_token: float | None = None
        self.last_token: float | None = None
        self.n_tokens = 0
        self.live: Any = None  # the engine's live turn stats of the first segment

    def wrap(self, engine: Any) -> Any:
        return _ProbedEngine(engine, self)

    def observe(self, engine: Any, tokens: Iterator[int]) -> Iterator[int]:
        if self.started is None:
            self.started = time.perf_counter()
        for token in tokens:
            now = time.perf_counter()
            if self.first_token is None:
                self.first_token = now
                self.live = getattr(engine, "live_turn", None)
            self.last_token = now
            self.n_tokens += 1
            yield token

    def timings(self) -> dict[str, Any]:
        """The timings so far, in llama-server's field names."""
        n = self.n_tokens
        steps = max(0, n - 1)
        first, last, started = self.first_token, self.last_token, self.started
        predicted_ms = (last - first) * 1e3 if first is not None and last is not None else 0.0
        body: dict[str, Any] = {}
        if self.live is not None:
            prompt_n = int(self.live.prefill_tokens)
            prompt_ms = float(self.live.prefill_ms)
            body["cache_n"] = int(self.live.cached_tokens)
            body["prompt_n"] = prompt_n
        else:
            prompt_n = 0
            prompt_ms = (
                (first - started) * 1e3 if first is not None and started is not None else 0.0
            )
        body["prompt_ms"] = round(prompt_ms, 3)
        if self.live is not None:
            body["prompt_per_token_ms"] = prompt_ms / prompt_n if prompt_n > 0 else 0.0
            body["prompt_per_second"] = prompt_n / (prompt_ms / 1e3) if prompt_ms > 0 else 0.0
        body["predicted_n"] = n
        body["predicted_ms"] = round(predicted_ms, 3)
        body["predicted_per_token_ms"] = predicted_ms / steps if steps and predicted_ms > 0 else 0.0
        body["predicted_per_second"] = (
            steps / (predicted_ms / 1e3) if steps and predicted_ms > 0 else 0.0
        )
        return body


class _ProbedEngine:
    """The engine, with `generate` observed by a probe; everything else passes through."""

    __slots__ = ("_engine", "_probe")

    def __init__(self, engine: Any, probe: TimingProbe) -> None:
        self._engine = engine
        self._probe = probe

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def generate(self, prompt: Sequence[int], **kwargs: Any) -> Iterator[int]:
        inner = self._engine.generate(prompt, **kwargs)
        try:
            yield from self._probe.observe(self._engine, inner)
        finally:
            inner.close()
