"""The one request flow of every API that runs a job on the engine worker.

Chat completions, /completion, /v1/completions, Responses, Anthropic Messages and the
slot actions all go the same way:

1. `read_json`: read the body (a client that leaves while sending it: `ClientGoneError`);
2. `submit`: queue the job on the worker (QueueFullError past the bound);
3. follow it (`Submitted.first`, `Submitted.events`): the client is asked whether it is
   still there at least every `disconnect.DISCONNECT_POLL_S`; one that left has its job
   cancelled and, while it still waits, withdrawn from the queue at once
   (`ClientGoneError`);
4. answer: collect the events into one body, or stream them (`sse_stream`) in the API's
   own format (`StreamFormat`); a job that fails after the stream began ends it with the
   format's error lines.

A `ClientGoneError` becomes nginx's 499 (server/error_map.py), which nobody reads.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from fastapi.responses import Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request

from kvmem.chat.turn import TurnDone
from kvmem.errors import ClientGoneError, JobCrashedError, KVMemError
from kvmem.server.channel import JobFailed, JobStarted
from kvmem.server.completion_job import CompletionDone
from kvmem.server.conversation_job import ConversationDone
from kvmem.server.disconnect import next_or_disconnect
from kvmem.server.json_body import parse_json_body
from kvmem.server.live_timings import TimingsSnapshot
from kvmem.server.slot_job import SlotDone
from kvmem.server.sse import SSE_HEADERS
from kvmem.server.state import ServerState
from kvmem.server.worker import Job

FINAL_EVENTS = (TurnDone, CompletionDone, SlotDone, ConversationDone)
THREAD_PARSE_BYTES = 256 * 1024


async def read_body(request: Request) -> bytes:
    """The raw body; ClientGoneError when the client disconnected while sending it."""
    try:
        return await request.body()
    except ClientDisconnect:
        raise ClientGoneError from None


async def read_json(request: Request) -> Any:
    """The body parsed as JSON (depth, number-size and surrogate limits; a 400 when it is
    not JSON); ClientGoneError when the client disconnected while sending it. A body of
    THREAD_PARSE_BYTES or more is parsed and checked in a worker thread (seconds for a few
    MB), so the event loop keeps answering /health."""
    body = await read_body(request)
    if len(body) < THREAD_PARSE_BYTES:
        return parse_json_body(body)
    return await run_in_threadpool(parse_json_body, body)


def job_error(failed: JobFailed) -> KVMemError:
    """The error a failed job raises in its route: a KVMemError as it is, anything else
    as JobCrashedError (a 500 the worker has already logged and counted)."""
    error = failed.error
    return error if isinstance(error, KVMemError) else JobCrashedError(error)


@dataclass(slots=True)
class Submitted:
    """A job on the worker's queue, followed for the client of `request`."""

    request: Request
    state: ServerState
    job: Job

    def leave(self) -> None:
        """The client went away: stop the job, and take it off the queue if it waits."""
        self.job.cancel.set()
        self.state.worker.withdraw(self.job)

    async def next_event(self) -> Any:
        """The job's next event; ClientGoneError (after `leave`) when the client went away."""
        alive, event = await next_or_disconnect(self.request, self.job.channel)
        if not alive:
            self.leave()
            raise ClientGoneError
        return event

    async def first(self) -> Any:
        """The first event (JobStarted for a generation, SlotDone for a slot action);
        raises the job's error, or ClientGoneError."""
        event = await self.next_event()
        if isinstance(event, JobFailed):
            raise job_error(event)
        return event

    async def events(self, *, timings: bool = False) -> AsyncIterator[Any]:
        """The events up to the final one (TurnDone, CompletionDone); raises the job's
        error, or ClientGoneError. JobStarted is left out, TimingsSnapshot too unless
        `timings`. The job is cancelled when the iteration ends (a no-op after its final
        event)."""
        try:
            while True:
                event = await self.next_event()
                if isinstance(event, JobFailed):
                    raise job_error(event)
                if isinstance(event, JobStarted) or (
                    isinstance(event, TimingsSnapshot) and not timings
                ):
                    continue
                yield event
                if isinstance(event, FINAL_EVENTS):
                    return
        finally:
            self.job.cancel.set()


def submit(request: Request, state: ServerState, job: Job) -> Submitted:
    """Queue `job` (QueueFullError past the bound, 503s while loading or stopping)."""
    state.worker.submit(job)
    return Submitted(request, state, job)


class StreamFormat(Protocol):
    """One API's server-sent events for a job's events (each a list of SSE lines)."""

    def head(self) -> list[str]: ...

    def lines(self, event: Any) -> list[str]: ...

    def error(self, exc: Exception) -> list[str]: ...

    def tail(self) -> list[str]: ...


def sse_stream(submitted: Submitted, fmt: StreamFormat, *, timings: bool = False) -> Response:
    """The job's events as SSE in `fmt`: its head, its lines per event, then its tail after
    the final event, or its error lines when the job fails; a client that left ends the
    stream silently (its job is cancelled)."""

    async def stream() -> AsyncIterator[str]:
        for line in fmt.head():
            yield line
        events = submitted.events(timings=timings)
        try:
            while True:
                try:
                    event = await anext(events)
                except StopAsyncIteration:
                    break
                except ClientGoneError:
                    return
                except Exception as exc:  # the job failed after the stream began
                    for line in fmt.error(exc):
                        yield line
                    return
                for line in fmt.lines(event):
                    yield line
        finally:
            # first, before any await (a cancelled task gets no further): stops the
            # generation when the stream was cut short; a no-op after the final event
            submitted.job.cancel.set()
            await events.aclose()
        for line in fmt.tail():
            yield line

    return StreamingResponse(stream(), media_type="text/event-stream", headers=SSE_HEADERS)
