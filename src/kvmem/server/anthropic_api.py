"""`POST /v1/messages` and `POST /v1/messages/count_tokens`: the Anthropic Messages API.

A message runs as one chat turn on the KVMem session (server/api_turn.py), as chat
completions do. Authentication takes `x-api-key` (what Anthropic clients send) or a
Bearer token. Every error on these routes, the authentication error included, uses
Anthropic's envelope `{"type": "error", "error": {"type", "message"}}`: the route class
below catches them before the OpenAI-envelope handlers of the app.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from starlette.requests import ClientDisconnect

from kvmem.errors import InvalidRequestError, KVMemError
from kvmem.server.anthropic_events import MessageBuilder, sse_event
from kvmem.server.anthropic_schema import (
    chat_request,
    parse_count_request,
    parse_messages_request,
)
from kvmem.server.api_turn import ClientGone, QueuedTurn, count_tokens, start_turn
from kvmem.server.auth import require_api_key
from kvmem.server.error_map import anthropic_payload, anthropic_response
from kvmem.server.json_body import parse_json_body

logger = logging.getLogger(__name__)


class AnthropicRoute(APIRoute):
    """Errors of these routes (dependencies included) in Anthropic's envelope."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except KVMemError as exc:
                return anthropic_response(exc)
            except RequestValidationError as exc:
                return anthropic_response(InvalidRequestError(f"invalid request: {exc}"))

        return route


anthropic_router = APIRouter(route_class=AnthropicRoute, dependencies=[Depends(require_api_key)])


async def _body(request: Request) -> Any:
    return parse_json_body(await request.body())


@anthropic_router.post("/v1/messages")
async def messages(request: Request) -> Response:
    try:
        body = await _body(request)
    except ClientDisconnect:
        return Response(status_code=499)
    r = parse_messages_request(body)
    chat = chat_request(r)
    try:
        turn = await start_turn(request, chat)
    except ClientGone:
        return Response(status_code=499)
    builder = MessageBuilder(turn.model, turn.prompt_tokens)
    if r.stream:
        return StreamingResponse(
            _stream(turn, builder),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    try:
        async for event in turn.events():
            builder.push(event)
    except ClientGone:
        return Response(status_code=499)
    return JSONResponse(builder.message())


async def _stream(turn: QueuedTurn, builder: MessageBuilder) -> AsyncIterator[str]:
    for body in builder.start():
        yield sse_event(body)
    try:
        async for event in turn.events():
            for body in builder.push(event):
                yield sse_event(body)
    except ClientGone:
        return
    except Exception as exc:  # the job failed after the stream began
        _, payload = anthropic_payload(exc)
        yield sse_event(payload)


@anthropic_router.post("/v1/messages/count_tokens")
async def count(request: Request) -> Response:
    try:
        body = await _body(request)
    except ClientDisconnect:
        return Response(status_code=499)
    r = parse_count_request(body)
    return JSONResponse({"input_tokens": count_tokens(request, chat_request(r))})
