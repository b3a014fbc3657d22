"""`POST /v1/messages` and `POST /v1/messages/count_tokens`: the Anthropic Messages API.

A message runs as one chat turn on the KVMem session (server/chat_flow.py), as chat
completions do. Authentication takes `x-api-key` (what Anthropic clients send) or a
Bearer token. Every error on these routes, the authentication error included, uses
Anthropic's envelope `{"type": "error", "error": {"type", "message"}}`: the route class
below catches them before the OpenAI-envelope handlers of the app.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute

from kvmem.errors import InvalidRequestError, KVMemError
from kvmem.server.anthropic_events import MessageBuilder
from kvmem.server.anthropic_schema import (
    chat_request,
    parse_count_request,
    parse_messages_request,
)
from kvmem.server.chat_flow import NamedEvents, collect, count_chat_tokens, event_stream, start_chat
from kvmem.server.error_map import anthropic_payload, anthropic_response
from kvmem.server.flow import read_json
from kvmem.server.state import ready_state

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


anthropic_router = APIRouter(route_class=AnthropicRoute)


@anthropic_router.post("/v1/messages")
async def messages(request: Request) -> Response:
    r = parse_messages_request(await read_json(request))
    turn = await start_chat(request, ready_state(request), chat_request(r))
    builder = MessageBuilder(turn.model, turn.prompt_tokens)
    if r.stream:
        return event_stream(turn, NamedEvents(builder, lambda e: anthropic_payload(e)[1]))
    await collect(turn, builder)
    return JSONResponse(builder.message())


@anthropic_router.post("/v1/messages/count_tokens")
async def count(request: Request) -> Response:
    r = parse_count_request(await read_json(request))
    count = await count_chat_tokens(ready_state(request), chat_request(r))
    return JSONResponse({"input_tokens": count})
