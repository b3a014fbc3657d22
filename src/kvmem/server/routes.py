"""HTTP routes: health (public), models, props, metrics and chat completions (API key)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from kvmem.chat.turn import TurnDone
from kvmem.errors import (
    EngineNotReadyError,
    InvalidRequestError,
    RpcWorkerLostError,
    ServerShuttingDownError,
)
from kvmem.server.auth import require_api_key
from kvmem.server.channel import EventChannel, JobFailed, JobStarted
from kvmem.server.chat_job import ChatJob, prepare_chat_job
from kvmem.server.disconnect import next_or_disconnect
from kvmem.server.error_map import envelope, error_payload, failed_response
from kvmem.server.json_body import parse_json_body
from kvmem.server.live_timings import TimingsSnapshot
from kvmem.server.logit_bias import banned_tokens
from kvmem.server.prompt_limits import check_prompt_size, message_chars
from kvmem.server.prompt_progress import ProgressSnapshot
from kvmem.server.props import PROCESS_STARTED, models_body, props_body, served_model_id
from kvmem.server.responses import (
    SSE_DONE,
    ChunkWriter,
    CompletionAccumulator,
    merge_choices,
    sse_data,
)
from kvmem.server.rpc_status import rpc_body
from kvmem.server.schemas import parse_chat_request
from kvmem.server.worker import WorkerState

if TYPE_CHECKING:
    from kvmem.server.app import ServerState

logger = logging.getLogger(__name__)

health_router = APIRouter()
api_router = APIRouter(dependencies=[Depends(require_api_key)])


def _state(request: Request) -> ServerState:
    return request.app.state.kvmem


def _ready_state(request: Request) -> ServerState:
    state = _state(request)
    if state.worker.state is WorkerState.STOPPED:
        raise ServerShuttingDownError("the server is shutting down")
    if isinstance(state.worker.load_error, RpcWorkerLostError):  # --rpc: a worker went away
        raise state.worker.load_error
    if state.worker.state is not WorkerState.READY or state.template is None:
        raise EngineNotReadyError(f"the model is not ready ({state.worker.state.value})")
    return state


@health_router.get("/health")
@health_router.get("/v1/health")
async def health(request: Request) -> JSONResponse:
    state = _state(request)
    worker = state.worker
    rpc = {"rpc": state.rpc.health()} if state.rpc is not None else {}  # --rpc workers
    if worker.state is WorkerState.READY:
        return JSONResponse({"status": "ok", **rpc})
    message = (
        "Loading model" if worker.state is WorkerState.LOADING else f"model {worker.state.value}"
    )
    if worker.state is WorkerState.LOST:
        message = str(worker.load_error)
    body = {
        "status": worker.state.value,
        "error": {"message": message, "type": "unavailable_error", "param": None, "code": 503},
        **rpc,
    }
    return JSONResponse(body, status_code=503)


@api_router.get("/v1/models")
@api_router.get("/models")
async def models(request: Request) -> JSONResponse:
    state = _ready_state(request)
    assert state.info is not None
    return JSONResponse(models_body(state.settings, state.info))


@api_router.get("/props")
async def props(request: Request) -> JSONResponse:
    state = _ready_state(request)
    assert state.info is not None and state.template is not None
    body = props_body(state.settings, state.info, state.template)
    body["kvmem"]["window"] = state.window() if state.window is not None else {}
    body["kvmem"]["transfer"] = state.transfer() if state.transfer is not None else {}
    if state.rpc is not None:  # --rpc: the workers and which layers live where
        body["rpc"] = rpc_body(state.settings, state.info)
    return JSONResponse(body)


@api_router.get("/metrics")
async def metrics(request: Request) -> Response:
    state = _state(request)
    if not state.settings.metrics:
        return envelope(
            501,
            "this server has no metrics endpoint: start it with --metrics",
            "not_supported_error",
        )
    response = PlainTextResponse(state.metrics.render(), media_type="text/plain; version=0.0.4")
    # llama-server's header, in its exact case (clients look it up case-sensitively)
    response.raw_headers.append((b"Process-Start-Time-Unix", str(PROCESS_STARTED).encode()))
    return response


async def _next_event(
    request: Request, channel: EventChannel, job: ChatJob, state: ServerState
) -> Any:
    """The job's next event; None when the client went away (the job is then cancelled
    and, if it is still waiting, leaves the queue at once)."""
    alive, event = await next_or_disconnect(request, channel)
    if not alive:
        job.cancel.set()
        state.worker.withdraw(job)
    return event


@api_router.post("/v1/chat/completions")
@api_router.post("/chat/completions")
async def chat_completions(request: Request) -> Response:
    try:
        raw = await request.body()
    except ClientDisconnect:
        return Response(status_code=499)
    chat = parse_chat_request(parse_json_body(raw))
    state = _ready_state(request)
    assert state.template is not None and state.info is not None
    check_prompt_size(message_chars(chat.messages), state.info)
    n = chat.n or 1
    if n > 1 and chat.stream:
        raise InvalidRequestError("n > 1 is not supported with stream=true", "n")
    loop = asyncio.get_running_loop()

    def prepare() -> list[ChatJob]:  # template and grammar work, off the event loop
        assert state.template is not None
        first = prepare_chat_job(chat, state.settings, state.template, EventChannel(loop))
        if chat.logit_bias is not None and state.vocab is not None:
            first.banned_tokens = banned_tokens(state.vocab, chat.logit_bias)
        # n choices run one after another on the one KVMem lane, all from the one rendering
        return [first] + [first.another_choice(EventChannel(loop)) for _ in range(n - 1)]

    jobs = await run_in_threadpool(prepare)
    check_prompt_size(len(jobs[0].rendered.text), state.info)
    model = served_model_id(state.settings, state.info)
    block_tokens = state.settings.engine.kvmem.block_tokens
    verbose = bool(chat.verbose) or state.settings.verbosity >= 5
    if chat.stream:
        job = jobs[0]
        state.worker.submit(job)
        first = await _next_event(request, job.channel, job, state)
        if first is None:
            return Response(status_code=499)
        if isinstance(first, JobFailed):
            return failed_response(first.error)
        include_usage = bool(chat.stream_options and chat.stream_options.include_usage)
        writer = ChunkWriter(model=model, include_usage=include_usage, block_tokens=block_tokens)
        return StreamingResponse(
            _stream(request, job.channel, job, writer, state),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    bodies = []
    for job in jobs:
        state.worker.submit(job)
        acc = CompletionAccumulator(model=model, block_tokens=block_tokens)
        while True:
            event = await _next_event(request, job.channel, job, state)
            if event is None:
                return Response(status_code=499)
            if isinstance(event, JobFailed):
                return failed_response(event.error)
            if isinstance(event, JobStarted):
                continue
            acc.add(event)
            if isinstance(event, TurnDone):
                bodies.append(acc.body())
                break
    result = merge_choices(bodies)
    if verbose:
        result["__verbose"] = {"prompt": jobs[0].rendered.text}
    return JSONResponse(result)


async def _stream(
    request: Request, channel: EventChannel, job: ChatJob, writer: ChunkWriter, state: ServerState
) -> AsyncIterator[str]:
    try:
        yield writer.role()
        while True:
            event = await _next_event(request, channel, job, state)
            if event is None:
                return
            if isinstance(event, JobFailed):
                _, body = error_payload(event.error)
                yield sse_data(body)
                break
            if isinstance(event, TimingsSnapshot):  # timings_per_token
                writer.live_timings = event.body
                continue
            if isinstance(event, ProgressSnapshot):  # return_progress
                yield writer.progress(event.body)
                continue
            for line in writer.event(event):
                yield line
            if isinstance(event, TurnDone):
                break
        yield SSE_DONE
    finally:
        job.cancel.set()  # a no-op after TurnDone; stops generation if the client went away
