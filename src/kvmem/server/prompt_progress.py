"""`return_progress`: llama-server's prompt-processing progress in a stream.

A streamed request that sets `return_progress: true` gets one chunk with `prompt_progress:
{total, cache, processed, time_ms}` when the prompt's processing starts (`processed` ==
`cache`, the reused prefix) and one after each prefill chunk, `processed` growing to
`total`; `time_ms` counts from the start. The engine reports through the `progress`
callback of `generate` (`kvmem.engine.trace.PrefillProgress`); `ProgressReporter.wrap`
hands that callback to the turn's first `generate` call (later segments of a turn, such
as a forced tool-call prefix, are not prompt processing a client waits on). A step that
does not move `processed` forward (a replay against a new window) is not sent. With
`timings_per_token` each progress chunk also carries llama-server's `timings` of the prompt
so far (`progress_timings`): the first one all zero, `prompt_ms` growing, nothing predicted.

/completion chunks are the native token chunk with no token; /v1/completions chunks an
empty text choice; /v1/chat/completions chunks a role delta, as llama-server sends them.
The Anthropic and Responses APIs refuse the field (their schemas forbid unknown fields).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from kvmem.server.channel import EventChannel


@dataclass(slots=True)
class ProgressSnapshot:
    """A `prompt_progress` body for the stream (worker -> route)."""

    body: dict[str, int]
    timings: dict[str, Any] | None = None  # timings_per_token: the prompt's timings so far


def progress_timings(body: dict[str, int]) -> dict[str, Any]:
    """llama-server's `timings` for a progress step: the prompt so far, no tokens predicted."""
    prompt_n = body["processed"] - body["cache"]
    prompt_ms = float(body["time_ms"])
    return {
        "cache_n": body["cache"],
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n > 0 else 0.0,
        "prompt_per_second": prompt_n * 1e3 / prompt_ms if prompt_ms > 0 else 0.0,
        "predicted_n": 0,
        "predicted_ms": 0.0,
        "predicted_per_token_ms": 0.0,
        "predicted_per_second": 0.0,
    }


class ProgressReporter:
    """Puts a ProgressSnapshot on the job's channel for each step forward of the prefill."""

    __slots__ = ("_channel", "_started", "_last", "_timings")

    def __init__(self, channel: EventChannel, timings: bool = False) -> None:
        self._channel = channel
        self._timings = timings  # timings_per_token: each snapshot carries progress_timings
        self._started: float | None = None
        self._last: int | None = None

    def wrap(self, engine: Any) -> Any:
        return _ReportingEngine(engine, self)

    def report(self, progress: Any) -> None:
        """The engine's callback: `progress` is a kvmem.engine.trace.PrefillProgress."""
        now = time.perf_counter()
        if self._started is None:
            self._started = now
        if self._last is not None and progress.processed <= self._last:
            return
        self._last = progress.processed
        body = {
            "total": progress.total,
            "cache": progress.cache,
            "processed": progress.processed,
            "time_ms": int((now - self._started) * 1e3),
        }
        self._channel.put(ProgressSnapshot(body, progress_timings(body) if self._timings else None))


class _ReportingEngine:
    """The engine, its first `generate` call reporting progress; the rest passes through."""

    __slots__ = ("_engine", "_reporter", "_used")

    def __init__(self, engine: Any, reporter: ProgressReporter) -> None:
        self._engine = engine
        self._reporter = reporter
        self._used = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def generate(self, prompt: Sequence[int], **kwargs: Any) -> Iterator[int]:
        if not self._used:
            self._used = True
            kwargs["progress"] = self._reporter.report
        return self._engine.generate(prompt, **kwargs)


def native_progress_chunk(body: dict[str, int]) -> dict[str, Any]:
    """/completion: a token chunk without a token."""
    return {
        "index": 0,
        "content": "",
        "tokens": [],
        "stop": False,
        "id_slot": 0,
        "prompt_progress": body,
    }
