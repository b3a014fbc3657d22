"""The request flow the Responses and Anthropic Messages routes share.

Both read the body (a client that left while sending it: 499), start one chat turn
(server/api_turn.py), and feed its events to an API-specific builder: collected into one
JSON body, or streamed as named SSE events (`event: <type>` + `data: <json>`). Each API
keeps its own parts: the builder, the error event a stream ends with when the job fails
after the stream began (each API's own envelope), and the step after a complete turn
(the Responses API stores the response for `previous_response_id`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from starlette.requests import ClientDisconnect

from kvmem.chat.turn import TurnEvent
from kvmem.server.api_turn import ClientGone, QueuedTurn
from kvmem.server.json_body import parse_json_body

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class EventBuilder(Protocol):
    """Turns a chat turn's events into one API's bodies (response_events, anthropic_events)."""

    def start(self) -> list[dict[str, Any]]: ...

    def push(self, event: TurnEvent) -> list[dict[str, Any]]: ...


def sse_event(body: dict[str, Any]) -> str:
    """One named server-sent event: the body's `type` is the event name."""
    return f"event: {body['type']}\ndata: {json.dumps(body, ensure_ascii=False)}\n\n"


def client_left() -> Response:
    """The status a request gets whose client went away (nginx's 499)."""
    return Response(status_code=499)


async def read_json(request: Request) -> Any:
    """The request body parsed as JSON (a 400 when it is not); ClientGone when the client
    disconnected while sending it."""
    try:
        raw = await request.body()
    except ClientDisconnect:
        raise ClientGone from None
    return parse_json_body(raw)


async def collect(turn: QueuedTurn, builder: EventBuilder) -> bool:
    """Feed the whole turn to `builder`; False when the client went away meanwhile."""
    try:
        async for event in turn.events():
            builder.push(event)
    except ClientGone:
        return False
    return True


def event_stream(
    turn: QueuedTurn,
    builder: EventBuilder,
    error_event: Callable[[Exception], dict[str, Any]],
    after: Callable[[], None] | None = None,
) -> StreamingResponse:
    """The turn as SSE: the builder's start events, then its events per turn event. A job
    that fails after the stream began ends it with `error_event(exc)`; a client that left
    ends it silently; `after` runs once the turn completed."""

    async def stream() -> AsyncIterator[str]:
        for body in builder.start():
            yield sse_event(body)
        try:
            async for event in turn.events():
                for body in builder.push(event):
                    yield sse_event(body)
        except ClientGone:
            return
        except Exception as exc:  # the job failed after the stream began
            yield sse_event(error_event(exc))
            return
        if after is not None:
            after()

    return StreamingResponse(stream(), media_type="text/event-stream", headers=SSE_HEADERS)
