"""The engine worker: one job at a time, bounded queue, cancellation, load failure, shutdown."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from kvmem.chat.prompt import RenderedPrompt
from kvmem.chat.turn import ChatFinish, TextDelta, TurnDone
from kvmem.errors import (
    EngineNotReadyError,
    ModelLoadError,
    QueueFullError,
    ServerShuttingDownError,
)
from kvmem.sampling import SamplingParams
from kvmem.server.channel import JobFailed, JobStarted
from kvmem.server.chat_job import ChatJob
from kvmem.server.metrics import ServerMetrics
from kvmem.server.worker import EngineWorker, WorkerState
from tests.fakes.engine import FakeEngine


class ListChannel:
    def __init__(self) -> None:
        self.items: list[Any] = []
        self.done = threading.Event()

    def put(self, item: Any) -> None:
        self.items.append(item)
        if isinstance(item, (TurnDone, JobFailed)):
            self.done.set()


def job(text: str = "Q") -> ChatJob:
    return ChatJob(
        rendered=RenderedPrompt(text, None, False), sampling=SamplingParams(), channel=ListChannel()
    )  # type: ignore[arg-type]


def ready_worker(engine: FakeEngine, queue_size: int = 4) -> EngineWorker:
    worker = EngineWorker(lambda: engine, queue_size, ServerMetrics())
    worker.start()
    for _ in range(500):
        if worker.state is WorkerState.READY:
            return worker
        time.sleep(0.01)
    raise AssertionError("worker not ready")


def test_jobs_run_in_order_with_started_then_events() -> None:
    engine = FakeEngine(replies=["ab", "cd"])
    worker = ready_worker(engine)
    first, second = job("one"), job("two")
    worker.submit(first)
    worker.submit(second)
    assert second.channel.done.wait(5)  # type: ignore[attr-defined]
    items = first.channel.items  # type: ignore[attr-defined]
    assert isinstance(items[0], JobStarted) and items[0].prompt_tokens == 3
    assert isinstance(items[-1], TurnDone) and items[-1].finish_reason is ChatFinish.STOP
    assert [c.prompt for c in engine.calls] == ["one", "two"]
    worker.stop()
    assert engine.closed and worker.state is WorkerState.STOPPED


def test_queue_bound_and_cancelled_waiting_job_is_skipped() -> None:
    engine = FakeEngine(replies=lambda prompt: "x" * 50, token_delay_s=0.01)
    worker = ready_worker(engine, queue_size=1)
    running, waiting = job("run"), job("wait")
    worker.submit(running)
    assert engine.started.wait(5)
    worker.submit(waiting)
    with pytest.raises(QueueFullError):
        worker.submit(job("overflow"))
    waiting.cancel.set()
    assert waiting.channel.done.wait(5)  # type: ignore[attr-defined]
    assert isinstance(waiting.channel.items[0], JobFailed)  # type: ignore[attr-defined]
    assert [c.prompt for c in engine.calls] == ["run"]
    worker.stop()


def test_cancel_all_stops_the_running_generation_with_the_shutting_down_error() -> None:
    engine = FakeEngine(replies=lambda prompt: "y" * 1000, token_delay_s=0.005)
    worker = ready_worker(engine)
    running = job()
    worker.submit(running)
    assert engine.started.wait(5)
    worker.cancel_all()
    assert running.channel.done.wait(5)  # type: ignore[attr-defined]
    items = running.channel.items  # type: ignore[attr-defined]
    # a stream cut short by the shutdown ends with a terminal error event (issue 28)
    assert isinstance(items[-1], JobFailed)
    assert type(items[-1].error) is ServerShuttingDownError
    assert not any(isinstance(item, TurnDone) for item in items)
    texts = [item for item in items if isinstance(item, TextDelta)]
    assert len(texts) < 1000  # stopped at the next token, not at the end
    with pytest.raises(EngineNotReadyError):
        worker.submit(job())
    worker.stop()


def test_load_failure_is_reported() -> None:
    failures: list[BaseException] = []

    def load() -> FakeEngine:
        raise ModelLoadError("bad weights")

    worker = EngineWorker(load, 2, ServerMetrics(), on_failed=failures.append)
    worker.start()
    for _ in range(500):
        if worker.state is WorkerState.FAILED:
            break
        time.sleep(0.01)
    assert worker.state is WorkerState.FAILED
    assert [str(e) for e in failures] == ["bad weights"]
    with pytest.raises(EngineNotReadyError):
        worker.submit(job())


def test_a_withdrawn_waiting_job_frees_its_queue_place_at_once() -> None:
    engine = FakeEngine(replies=lambda prompt: "x" * 200, token_delay_s=0.01)
    worker = ready_worker(engine, queue_size=1)
    running, leaver, next_one = job("run"), job("leave"), job("next")
    worker.submit(running)
    assert engine.started.wait(5)
    worker.submit(leaver)
    with pytest.raises(QueueFullError):
        worker.submit(job("refused"))
    leaver.cancel.set()
    worker.withdraw(leaver)
    assert worker.waiting == 0
    worker.submit(next_one)  # the place is free again while the first job still runs
    running.cancel.set()
    assert next_one.channel.done.wait(10)  # type: ignore[attr-defined]
    assert leaver.channel.items == []  # type: ignore[attr-defined]
    worker.stop()


def test_shutdown_answers_waiting_jobs_with_shutting_down() -> None:
    engine = FakeEngine(replies=lambda prompt: "y" * 1000, token_delay_s=0.005)
    worker = ready_worker(engine)
    running, waiting = job("run"), job("wait")
    worker.submit(running)
    assert engine.started.wait(5)
    worker.submit(waiting)
    worker.stop()
    assert not worker._thread.is_alive() and engine.closed
    (failed,) = waiting.channel.items  # type: ignore[attr-defined]
    assert isinstance(failed, JobFailed) and isinstance(failed.error, ServerShuttingDownError)
    with pytest.raises(ServerShuttingDownError):
        worker.submit(job())


def test_a_lost_rpc_worker_fails_running_and_waiting_jobs_and_later_ones() -> None:
    from kvmem.errors import RpcWorkerLostError

    engine = FakeEngine(replies=lambda prompt: "x" * 400, token_delay_s=0.01)
    worker = ready_worker(engine, queue_size=2)
    running, waiting = job("run"), job("wait")
    worker.submit(running)
    assert engine.started.wait(5)
    worker.submit(waiting)
    lost = RpcWorkerLostError("the RPC worker 127.0.0.1:50053 went away")
    worker.mark_lost(lost)
    for j in (running, waiting):
        assert j.channel.done.wait(5)  # type: ignore[attr-defined]
        failures = [i for i in j.channel.items if isinstance(i, JobFailed)]  # type: ignore[attr-defined]
        assert [f.error for f in failures] == [lost]
    assert worker.state is WorkerState.LOST
    with pytest.raises(RpcWorkerLostError) as err:
        worker.submit(job("later"))
    assert err.value is lost
    t0 = time.monotonic()
    worker.stop()  # does not wait for an engine thread that may never come back
    assert time.monotonic() - t0 < 10.0  # generous: it must not hang
