"""`POST /v1/responses` (OpenAI Responses API), `GET`/`DELETE /v1/responses/{id}`.

A response runs as one chat turn on the KVMem session (server/api_turn.py): the same
validation, template, tool grammars, reasoning split and prefix reuse as chat
completions. `previous_response_id` continues the conversation the server kept for that
response (server/response_store.py); its KV is usually still resident, so the continuation
reports it as `input_tokens_details.cached_tokens`. Errors use the OpenAI envelope.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import ClientDisconnect

from kvmem.chat.response_items import assistant_message
from kvmem.errors import NotFoundError
from kvmem.server.api_turn import ClientGone, QueuedTurn, start_turn
from kvmem.server.auth import require_api_key
from kvmem.server.error_map import error_payload
from kvmem.server.json_body import parse_json_body
from kvmem.server.response_store import ResponseStore
from kvmem.server.responses_events import ResponseBuilder, sse_event
from kvmem.server.responses_schema import (
    ResponsesRequest,
    chat_request,
    parse_responses_request,
    request_messages,
)

logger = logging.getLogger(__name__)

responses_router = APIRouter(dependencies=[Depends(require_api_key)])


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
    try:
        raw = await request.body()
    except ClientDisconnect:
        return Response(status_code=499)
    r = parse_responses_request(parse_json_body(raw))
    store = _store(request)
    previous = None
    if r.previous_response_id is not None:
        previous = store.get(r.previous_response_id)
        if previous is None:
            raise NotFoundError(
                f"previous response {r.previous_response_id!r} is not found: this server keeps "
                f"the last {store.max_responses} responses created with store=true",
                "previous_response_id",
            )
    conversation = request_messages(r, previous.conversation if previous else None)
    chat = chat_request(r, conversation)
    try:
        turn = await start_turn(request, chat)
    except ClientGone:
        return Response(status_code=499)
    builder = ResponseBuilder(turn.model, _echo(r))
    if r.stream:
        return StreamingResponse(
            _stream(turn, builder, r, conversation, store),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    try:
        async for event in turn.events():
            builder.push(event)
    except ClientGone:
        return Response(status_code=499)
    _keep(store, r, builder, conversation)
    return JSONResponse(builder.response())


async def _stream(
    turn: QueuedTurn,
    builder: ResponseBuilder,
    r: ResponsesRequest,
    conversation: list[dict[str, Any]],
    store: ResponseStore,
) -> AsyncIterator[str]:
    for body in builder.start():
        yield sse_event(body)
    try:
        async for event in turn.events():
            for body in builder.push(event):
                yield sse_event(body)
    except ClientGone:
        return
    except Exception as exc:  # the job failed after the stream began
        _, payload = error_payload(exc)
        error = payload["error"]
        yield sse_event(
            builder.numbered(
                "error", code=error["code"], message=error["message"], param=error["param"]
            )
        )
        return
    _keep(store, r, builder, conversation)


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
