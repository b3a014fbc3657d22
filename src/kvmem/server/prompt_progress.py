"""`return_progress`: llama-server's prompt-processing progress in a stream.

A streamed request that sets `return_progress: true` gets one chunk with `prompt_progress:
{total, cache, processed, time_ms}` when the prompt's processing starts (`processed` ==
`cache`, the reused prefix) and one after each prefill chunk, `processed` growing to
`total`; `time_ms` counts from the start. The engine reports through the `progress`
callback of `generate` (`kvmem.engine.trace.PrefillProgress`); `ProgressReporter.wrap`
hands that callback to the turn's first `generate` call (later segments of a turn, such
as a forced tool-call prefix, are not prompt processing a client waits on). A step that
does not move `processed` forward (a replay against a new window) is not sent.

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


class ProgressReporter:
    """Puts a ProgressSnapshot on the job's channel for each step forward of the prefill."""

    __slots__ = ("_channel", "_started", "_last")

    def __init__(self, channel: EventChannel) -> None:
        self._channel = channel
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
        self._channel.put(ProgressSnapshot(body))


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
