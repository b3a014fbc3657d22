"""`POST /v1/chat/completions` (and `/chat/completions`): OpenAI chat completions.

The request flow of server/flow.py with the chat preparation of server/chat_flow.py; the
bodies and SSE chunks are server/chat_bodies.py's. `n` choices run one after another on
the one KVMem lane, all from the one rendering; streaming takes one choice.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from kvmem.chat.turn import TurnDone
from kvmem.errors import InvalidRequestError
from kvmem.server.chat_bodies import ChunkWriter, CompletionAccumulator, merge_choices
from kvmem.server.chat_flow import check_messages, prepare_choices, start_chat
from kvmem.server.error_map import error_payload
from kvmem.server.flow import read_json, sse_stream, submit
from kvmem.server.live_timings import TimingsSnapshot
from kvmem.server.prompt_progress import ProgressSnapshot
from kvmem.server.schemas import ChatCompletionRequest, parse_chat_request
from kvmem.server.sse import SSE_DONE, sse_data
from kvmem.server.state import ServerState, ready_state

chat_router = APIRouter()


@chat_router.post("/v1/chat/completions")
@chat_router.post("/chat/completions")
async def chat_completions(request: Request) -> Response:
    chat = parse_chat_request(await read_json(request))
    state = ready_state(request)
    check_messages(state, chat)
    if (chat.n or 1) > 1 and chat.stream:
        raise InvalidRequestError("n > 1 is not supported with stream=true", "n")
    if chat.stream:
        return await _stream(request, state, chat)
    return await _collect(request, state, chat)


@dataclass(slots=True)
class _ChunkStream:
    """Chat completion chunks as the stream's SSE lines (flow.StreamFormat)."""

    writer: ChunkWriter

    def head(self) -> list[str]:
        return [self.writer.role()]

    def lines(self, event: Any) -> list[str]:
        if isinstance(event, TimingsSnapshot):  # timings_per_token
            self.writer.live_timings = event.body
            return []
        if isinstance(event, ProgressSnapshot):  # return_progress
            return [self.writer.progress(event.body, event.timings)]
        return self.writer.event(event)

    def error(self, exc: Exception) -> list[str]:
        return [sse_data(error_payload(exc)[1]), SSE_DONE]

    def tail(self) -> list[str]:
        return [SSE_DONE]


async def _stream(request: Request, state: ServerState, chat: ChatCompletionRequest) -> Response:
    turn = await start_chat(request, state, chat)
    include_usage = bool(chat.stream_options and chat.stream_options.include_usage)
    block_tokens = state.settings.engine.kvmem.block_tokens
    writer = ChunkWriter(model=turn.model, include_usage=include_usage, block_tokens=block_tokens)
    return sse_stream(turn.submitted, _ChunkStream(writer), timings=True)


async def _collect(request: Request, state: ServerState, chat: ChatCompletionRequest) -> Response:
    # template and grammar work, off the event loop
    jobs = await run_in_threadpool(prepare_choices, state, chat, asyncio.get_running_loop())
    block_tokens = state.settings.engine.kvmem.block_tokens
    bodies = []
    for job in jobs:
        acc = CompletionAccumulator(model=state.model_id, block_tokens=block_tokens)
        async for event in submit(request, state, job).events():
            acc.add(event)
            if isinstance(event, TurnDone):
                bodies.append(acc.body())
    result = merge_choices(bodies)
    if bool(chat.verbose) or state.settings.verbosity >= 5:
        result["__verbose"] = {"prompt": jobs[0].rendered.text}
    return JSONResponse(result)
