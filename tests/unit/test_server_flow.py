"""The request flow every API shares (server/flow.py), on the real worker with a fake engine:
a queued job whose client left is withdrawn at once, a failed job's error reaches the
route typed, and the events stop at the job's final one."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from kvmem.chat.prompt import RenderedPrompt
from kvmem.chat.turn import TextDelta, TurnDone
from kvmem.errors import ClientGoneError, InvalidRequestError, JobCrashedError
from kvmem.sampling import SamplingParams
from kvmem.server.channel import EventChannel, JobFailed
from kvmem.server.chat_job import ChatJob
from kvmem.server.error_map import error_payload
from kvmem.server.flow import job_error, submit
from tests.fakes.engine import FakeEngine
from tests.unit.test_server_worker import job, ready_worker


class _Client:
    """A request whose client is there until `gone`."""

    def __init__(self, gone: bool) -> None:
        self.scope: dict[str, Any] = {}
        self.gone = gone

    async def is_disconnected(self) -> bool:
        return self.gone


def _chat_job(text: str) -> ChatJob:
    channel = EventChannel(asyncio.get_running_loop())
    return ChatJob(
        rendered=RenderedPrompt(text, None, False), sampling=SamplingParams(), channel=channel
    )


def test_a_queued_job_whose_client_left_is_withdrawn_at_once() -> None:
    engine = FakeEngine(replies=lambda prompt: "x" * 400, token_delay_s=0.01)
    worker = ready_worker(engine, queue_size=1)
    state: Any = SimpleNamespace(worker=worker)
    running = job("run")
    worker.submit(running)
    assert engine.started.wait(5)

    async def leave() -> ChatJob:
        queued = _chat_job("queued")
        submitted = submit(_Client(gone=True), state, queued)  # type: ignore[arg-type]
        assert worker.waiting == 1
        with pytest.raises(ClientGoneError):
            await submitted.first()
        return queued

    queued = asyncio.run(leave())
    assert worker.waiting == 0 and queued.cancel.is_set()
    assert worker.busy  # the running job goes on
    running.cancel.set()
    assert running.channel.done.wait(10)  # type: ignore[attr-defined]
    worker.stop()
    assert [c.prompt for c in engine.calls] == ["run"]  # the withdrawn job never ran


def test_events_run_to_the_final_one_without_the_started_event() -> None:
    engine = FakeEngine(replies=["Hello"])
    worker = ready_worker(engine)
    state: Any = SimpleNamespace(worker=worker)

    async def follow() -> list[Any]:
        submitted = submit(_Client(gone=False), state, _chat_job("hi"))  # type: ignore[arg-type]
        return [event async for event in submitted.events()]

    events = asyncio.run(follow())
    worker.stop()
    assert isinstance(events[-1], TurnDone)
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "Hello"
    assert all(isinstance(e, TextDelta | TurnDone) for e in events)


def test_a_failed_job_raises_its_error_typed_and_a_crash_as_an_unlogged_500() -> None:
    bad = InvalidRequestError("bad grammar", "grammar")
    assert job_error(JobFailed(bad)) is bad
    crash = RuntimeError("boom")
    error = job_error(JobFailed(crash))
    assert type(error) is JobCrashedError and error.error is crash
    status, body = error_payload(error)
    assert status.status == 500
    assert body["error"]["message"] == "internal server error"
