"""The server's own information: /health (public), /models, /props and /metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from kvmem.server.error_map import envelope
from kvmem.server.props import PROCESS_STARTED, models_body, props_body
from kvmem.server.rpc_status import rpc_body
from kvmem.server.state import ready_state, server_state
from kvmem.server.worker import WorkerState

health_router = APIRouter()  # public, even with an API key
info_router = APIRouter()


@health_router.get("/health")
@health_router.get("/v1/health")
async def health(request: Request) -> JSONResponse:
    state = server_state(request)
    phase = state.phase
    rpc = {"rpc": state.rpc.health()} if state.rpc is not None else {}  # --rpc workers
    if phase == "ready":
        return JSONResponse({"status": "ok", **rpc})
    message = "Loading model" if phase == "loading" else f"model {phase}"
    if state.worker.state is WorkerState.LOST:
        message = str(state.worker.load_error)
    body = {
        "status": phase,
        "error": {"message": message, "type": "unavailable_error", "param": None, "code": 503},
        **rpc,
    }
    return JSONResponse(body, status_code=503)


@info_router.get("/v1/models")
@info_router.get("/models")
async def models(request: Request) -> JSONResponse:
    state = ready_state(request)
    assert state.info is not None
    return JSONResponse(models_body(state.settings, state.info))


@info_router.get("/props")
async def props(request: Request) -> JSONResponse:
    state = ready_state(request)
    assert state.info is not None and state.template is not None
    body = props_body(state.settings, state.info, state.template)
    body["kvmem"]["window"] = state.window() if state.window is not None else {}
    body["kvmem"]["transfer"] = state.transfer() if state.transfer is not None else {}
    if state.rpc is not None:  # --rpc: the workers and which layers live where
        body["rpc"] = rpc_body(state.settings, state.info)
    return JSONResponse(body)


@info_router.get("/metrics")
async def metrics(request: Request) -> Response:
    state = server_state(request)
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
