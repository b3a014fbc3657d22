"""`POST /v1/responses` (OpenAI Responses API), `GET`/`DELETE /v1/responses/{id}`.

A response runs as one chat turn on the KVMem session (server/chat_flow.py): the same
validation, template, tool grammars, reasoning split and prefix reuse as chat
completions. `previous_response_id` continues the conversation the server kept for that
response (server/response_store.py); its KV is usually still resident, so the continuation
reports it as `input_tokens_details.cached_tokens`. Errors use the OpenAI envelope.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from kvmem.chat.response_items import assistant_message
from kvmem.errors import NotFoundError
from kvmem.server.chat_flow import NamedEvents, collect, event_stream, start_chat
from kvmem.server.error_map import error_payload
from kvmem.server.flow import read_json
from kvmem.server.response_store import ResponseStore
from kvmem.server.responses_events import ResponseBuilder
from kvmem.server.responses_schema import (
    ResponsesRequest,
    chat_request,
    parse_responses_request,
    request_messages,
)
from kvmem.server.state import ready_state

logger = logging.getLogger(__name__)

responses_router = APIRouter()


def _store(request: Request) -> ResponseStore:
    return request.app.state.responses


def _echo(r: ResponsesRequest) -> dict[str, Any]:
    """The request fields a Response object repeats."""
    fmt = r.text.format if r.text is not None and r.text.format is not None else None
    return {
        "instructions": r.instructions,
        "max_output_tokens": r.max_output_tokens,
        "metadata": r.metadata or {},
        "parallel_tool_calls": r.parallel_tool_calls is not False,
        "previous_response_id": r.previous_response_id,
        "reasoning": {
            "effort": r.reasoning.effort if r.reasoning else None,
            "summary": r.reasoning.summary if r.reasoning else None,
        },
        "store": r.store,
        "temperature": r.temperature,
        "text": {
            "format": fmt.model_dump(exclude_none=True, by_alias=True) if fmt else {"type": "text"}
        },
        "tool_choice": r.tool_choice if r.tool_choice is not None else "auto",
        "tools": r.tools or [],
        "top_p": r.top_p,
        "truncation": "disabled",
        "user": r.user,
    }


def _keep(
    store: ResponseStore, r: ResponsesRequest, b: ResponseBuilder, conv: list[dict[str, Any]]
) -> None:
    if r.store:
        store.put(b.response(), [*conv, assistant_message(*b.output_parts())])


@responses_router.post("/v1/responses")
@responses_router.post("/responses")
async def create_response(request: Request) -> Response:
    store = _store(request)
    r = parse_responses_request(await read_json(request))
    conversation = request_messages(r, _previous(store, r))
    turn = await start_chat(request, ready_state(request), chat_request(r, conversation))
    builder = ResponseBuilder(turn.model, _echo(r))
    if r.stream:
        fmt = NamedEvents(
            builder,
            lambda exc: _error_event(builder, exc),
            lambda: _keep(store, r, builder, conversation),
        )
        return event_stream(turn, fmt)
    await collect(turn, builder)
    _keep(store, r, builder, conversation)
    return JSONResponse(builder.response())


def _previous(store: ResponseStore, r: ResponsesRequest) -> list[dict[str, Any]] | None:
    """The conversation kept for `previous_response_id` (None without one)."""
    if r.previous_response_id is None:
        return None
    previous = store.get(r.previous_response_id)
    if previous is None:
        raise NotFoundError(
            f"previous response {r.previous_response_id!r} is not found: this server keeps "
            f"the last {store.max_responses} responses created with store=true",
            "previous_response_id",
        )
    return previous.conversation


def _error_event(builder: ResponseBuilder, exc: Exception) -> dict[str, Any]:
    """A stream's `error` event: the OpenAI envelope's code, message and param."""
    _, payload = error_payload(exc)
    error = payload["error"]
    return builder.numbered(
        "error", code=error["code"], message=error["message"], param=error["param"]
    )


@responses_router.get("/v1/responses/{response_id}")
@responses_router.get("/responses/{response_id}")
async def get_response(request: Request, response_id: str) -> JSONResponse:
    item = _store(request).get(response_id)
    if item is None:
        raise NotFoundError(f"response {response_id!r} is not found", "response_id")
    return JSONResponse(item.body)


@responses_router.delete("/v1/responses/{response_id}")
@responses_router.delete("/responses/{response_id}")
async def delete_response(request: Request, response_id: str) -> JSONResponse:
    if not _store(request).delete(response_id):
        raise NotFoundError(f"response {response_id!r} is not found", "response_id")
    return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})
