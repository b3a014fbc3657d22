"""`--parallel N` in the worker: N lane threads, routing by shared prefix, the queue bound
beyond N, shutdown of every lane; and the flag's validation."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from kvmem.chat.turn import ChatFinish, TurnDone
from kvmem.cli.server_config import load_server_settings
from kvmem.config import lane_disk_dir
from kvmem.errors import ConfigError, QueueFullError, ServerShuttingDownError
from kvmem.server.channel import JobFailed
from kvmem.server.metrics import ServerMetrics
from kvmem.server.worker import EngineWorker, WorkerState
from tests.fakes.engine import FakeEngine, FakeStats
from tests.unit.test_server_worker import job


class FakeLane(FakeEngine):
    def route_score(self, prompt: Sequence[int]) -> int:
        n = 0
        for a, b in zip(self.history, prompt, strict=False):
            if a != b:
                break
            n += 1
        return n - (len(self.history) - n)


@dataclass
class FakeLanes:
    lanes: list[FakeLane]
    closed: bool = False
    stats: FakeStats = field(default_factory=FakeStats)

    @property
    def info(self):
        return self.lanes[0].info

    def close(self) -> None:
        self.closed = True

    def tier_gauges(self) -> dict[str, int]:
        return {}


def lanes_worker(lanes: FakeLanes, queue_size: int = 4) -> EngineWorker:
    worker = EngineWorker(lambda: lanes, queue_size, ServerMetrics())  # type: ignore[arg-type]
    worker.start()
    for _ in range(500):
        if worker.state is WorkerState.READY:
            return worker
        time.sleep(0.01)
    raise AssertionError("worker not ready")


def slow(n: int = 2) -> FakeLanes:
    return FakeLanes([FakeLane(replies=lambda p: "z" * 300, token_delay_s=0.01) for _ in range(n)])


def test_two_lanes_run_two_jobs_at_once_and_metrics_count_them() -> None:
    lanes = slow()
    worker = lanes_worker(lanes)
    a, b = job("first"), job("second")
    worker.submit(a)
    worker.submit(b)
    assert lanes.lanes[0].started.wait(5) and lanes.lanes[1].started.wait(5)
    assert worker.lanes_busy() == [True, True]
    assert worker._metrics.processing == 2
    a.cancel.set()
    b.cancel.set()
    assert a.channel.done.wait(5) and b.channel.done.wait(5)  # type: ignore[attr-defined]
    assert sorted(c.prompt for lane in lanes.lanes for c in lane.calls) == ["first", "second"]
    worker.stop()
    assert lanes.closed and worker._metrics.processing == 0


def test_a_prompt_goes_to_the_free_lane_sharing_its_prefix() -> None:
    lanes = FakeLanes([FakeLane(replies=lambda p: "ok") for _ in range(2)])
    lanes.lanes[1].history = [ord(c) for c in "conversation B: turn 1 and its long reply"]
    worker = lanes_worker(lanes)
    b2 = "conversation B: turn 1 and its long reply, turn 2"
    b3 = b2 + ", turn 3"
    for text in (b2, "conversation A: turn 1", b3):
        one = job(text)
        worker.submit(one)
        assert one.channel.done.wait(5)  # type: ignore[attr-defined]
    assert [c.prompt for c in lanes.lanes[1].calls] == [b2, b3]
    assert [c.prompt for c in lanes.lanes[0].calls] == ["conversation A: turn 1"]
    worker.stop()


def test_a_busy_lane_is_not_stolen_and_the_queue_bound_counts_beyond_the_lanes() -> None:
    lanes = slow()
    worker = lanes_worker(lanes, queue_size=1)
    first = job("same prefix 1")
    worker.submit(first)
    assert lanes.lanes[0].started.wait(5) or lanes.lanes[1].started.wait(5)
    second = job("same prefix 2")  # shares the busy lane's prefix: goes to the free one
    worker.submit(second)
    deadline = time.monotonic() + 5
    while worker.lanes_busy() != [True, True] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert worker.lanes_busy() == [True, True]
    third = job("queued")
    worker.submit(third)  # the one queue place
    with pytest.raises(QueueFullError):
        worker.submit(job("refused"))
    first.cancel.set()  # a lane frees: the queued job runs on it
    assert lanes.lanes[0].calls and lanes.lanes[1].calls
    deadline = time.monotonic() + 10
    while len(lanes.lanes[0].calls) + len(lanes.lanes[1].calls) < 3:
        assert time.monotonic() < deadline, "the queued job never started"
        time.sleep(0.01)
    worker.stop()
    for j in (first, second, third):
        assert j.channel.done.wait(5)  # type: ignore[attr-defined]
    last = first.channel.items[-1]  # type: ignore[attr-defined]
    assert isinstance(last, TurnDone) and last.finish_reason is ChatFinish.CANCELLED
    for j in (second, third):  # cut short by the shutdown: its terminal error (issue 28)
        last = j.channel.items[-1]  # type: ignore[attr-defined]
        assert isinstance(last, JobFailed) and type(last.error) is ServerShuttingDownError


def test_shutdown_ends_both_lanes_and_refuses_the_queue() -> None:
    lanes = slow()
    worker = lanes_worker(lanes)
    a, b, waiting = job("a"), job("b"), job("c")
    worker.submit(a)
    worker.submit(b)
    assert lanes.lanes[0].started.wait(5) and lanes.lanes[1].started.wait(5)
    worker.submit(waiting)
    worker.stop()
    assert lanes.closed and not worker._thread.is_alive()
    for running in (a, b):  # cut short: the terminal shutting-down error (issue 28)
        done = running.channel.items[-1]  # type: ignore[attr-defined]
        assert isinstance(done, JobFailed) and type(done.error) is ServerShuttingDownError
    (failed,) = waiting.channel.items  # type: ignore[attr-defined]
    assert isinstance(failed, JobFailed) and isinstance(failed.error, ServerShuttingDownError)


def test_parallel_flag_bounds() -> None:
    assert load_server_settings(["--parallel", "4"], {})[0].parallel == 4
    assert load_server_settings(["--parallel", "-1"], {})[0].parallel == 1
    with pytest.raises(ConfigError, match="--parallel: 5 lanes asked, at most 4"):
        load_server_settings(["--parallel", "5"], {})
    settings = load_server_settings(["--parallel", "2", "--kvmem-disk-dir", "/tmp/kvmem-x"], {})[0]
    assert (settings.parallel, settings.engine.kvmem.disk_dir) == (2, "/tmp/kvmem-x")
    dirs = [lane_disk_dir("/tmp/kvmem-x", k) for k in range(3)]
    assert dirs == ["/tmp/kvmem-x", "/tmp/kvmem-x/lane-1", "/tmp/kvmem-x/lane-2"]
    assert lane_disk_dir(None, 1) is None
