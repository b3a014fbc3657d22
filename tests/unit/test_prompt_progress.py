"""ProgressReporter (return_progress) without a model: the first `generate` call gets the
callback, each step forward becomes one snapshot and a step back (a replay) is dropped."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

from kvmem.engine.trace import PrefillProgress
from kvmem.server.channel import EventChannel
from kvmem.server.prompt_progress import (
    ProgressReporter,
    ProgressSnapshot,
    native_progress_chunk,
    progress_timings,
)


class _Engine:
    def __init__(self, steps: list[PrefillProgress]) -> None:
        self.steps = steps
        self.calls: list[dict[str, Any]] = []
        self.name = "engine"

    def generate(self, prompt: list[int], **kwargs: Any) -> Iterator[int]:
        self.calls.append(kwargs)
        report = kwargs.get("progress")
        for step in self.steps if report is not None else []:
            report(step)
        yield from prompt[:1]


def _run(steps: list[PrefillProgress], timings: bool = False) -> tuple[list[Any], _Engine]:
    async def main() -> tuple[list[Any], _Engine]:
        channel = EventChannel(asyncio.get_running_loop())
        engine = _Engine(steps)
        wrapped = ProgressReporter(channel, timings=timings).wrap(engine)
        assert wrapped.name == "engine"  # everything else passes through
        assert list(wrapped.generate([7, 8], max_tokens=2)) == [7]
        assert list(wrapped.generate([9], max_tokens=1)) == [9]  # a later segment: no callback
        await asyncio.sleep(0)
        got = []
        while not channel._queue.empty():
            got.append(channel._queue.get_nowait())
        return got, engine

    return asyncio.run(main())


def test_steps_forward_become_snapshots_and_a_replay_is_dropped() -> None:
    steps = [
        PrefillProgress(10, 2, 2),
        PrefillProgress(10, 2, 6),
        PrefillProgress(10, 2, 4),  # a replay from an earlier position
        PrefillProgress(10, 2, 6),
        PrefillProgress(10, 2, 10),
    ]
    got, engine = _run(steps)
    assert all(isinstance(e, ProgressSnapshot) for e in got)
    assert [(e.body["total"], e.body["cache"], e.body["processed"]) for e in got] == [
        (10, 2, 2),
        (10, 2, 6),
        (10, 2, 10),
    ]
    assert got[0].body["time_ms"] == 0
    assert set(got[0].body) == {"total", "cache", "processed", "time_ms"}
    assert "progress" in engine.calls[0] and "progress" not in engine.calls[1]
    assert engine.calls[1] == {"max_tokens": 1}
    assert all(e.timings is None for e in got)  # no timings_per_token


def test_with_timings_per_token_each_snapshot_carries_the_prompt_timings() -> None:
    got, _ = _run([PrefillProgress(10, 2, 2), PrefillProgress(10, 2, 10)], timings=True)
    assert [e.timings for e in got] == [progress_timings(e.body) for e in got]
    assert got[0].timings == {
        "cache_n": 2,
        "prompt_n": 0,
        "prompt_ms": 0.0,
        "prompt_per_token_ms": 0.0,
        "prompt_per_second": 0.0,
        "predicted_n": 0,
        "predicted_ms": 0.0,
        "predicted_per_token_ms": 0.0,
        "predicted_per_second": 0.0,
    }


def test_progress_timings_are_the_processed_tokens_over_the_time() -> None:
    timings = progress_timings({"total": 100, "cache": 20, "processed": 60, "time_ms": 200})
    assert timings["cache_n"] == 20 and timings["prompt_n"] == 40
    assert timings["prompt_ms"] == 200.0
    assert timings["prompt_per_token_ms"] == 5.0
    assert timings["prompt_per_second"] == 200.0
    assert (timings["predicted_n"], timings["predicted_ms"]) == (0, 0.0)


def test_native_chunk_is_a_token_chunk_without_a_token() -> None:
    body = {"total": 3, "cache": 0, "processed": 3, "time_ms": 5}
    assert native_progress_chunk(body) == {
        "index": 0,
        "content": "",
        "tokens": [],
        "stop": False,
        "id_slot": 0,
        "prompt_progress": body,
    }
