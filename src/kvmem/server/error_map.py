"""The one place where exception types become HTTP errors in OpenAI's error envelope:
`{"error": {"message", "type", "param", "code"}}`."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from kvmem.errors import (
    AuthenticationError,
    ClientGoneError,
    ContextLengthExceededError,
    ContextPoolExhaustedError,
    EngineNotReadyError,
    GrammarDeadlineError,
    InvalidRequestError,
    JobCrashedError,
    KVMemError,
    NotFoundError,
    PinnedTooLargeError,
    QueueFullError,
    RpcWorkerLostError,
    ServerShuttingDownError,
    TemplateError,
)

logger = logging.getLogger(__name__)

RETRY_AFTER_S = "1"


@dataclass(frozen=True, slots=True)
class HttpError:
    status: int
    type: str
    code: str | None
    headers: dict[str, str] = field(default_factory=dict)


# Checked in order: subclasses before their bases.
_BY_TYPE: tuple[tuple[type[BaseException], HttpError], ...] = (
    (
        ContextLengthExceededError,
        HttpError(400, "exceed_context_size_error", "context_length_exceeded"),
    ),
    (ContextPoolExhaustedError, HttpError(500, "server_error", "context_pool_exhausted")),
    (GrammarDeadlineError, HttpError(400, "invalid_request_error", "grammar_deadline_exceeded")),
    (InvalidRequestError, HttpError(400, "invalid_request_error", "invalid_request")),
    (ClientGoneError, HttpError(499, "invalid_request_error", "client_closed_request")),
    (TemplateError, HttpError(400, "invalid_request_error", "template_error")),
    (NotFoundError, HttpError(404, "invalid_request_error", "not_found")),
    (PinnedTooLargeError, HttpError(413, "invalid_request_error", "pinned_context_too_large")),
    (AuthenticationError, HttpError(401, "authentication_error", "invalid_api_key")),
    (QueueFullError, HttpError(503, "server_error", "queue_full", {"Retry-After": RETRY_AFTER_S})),
    (
        ServerShuttingDownError,
        HttpError(503, "unavailable_error", "shutting_down", {"Connection": "close"}),
    ),
    (RpcWorkerLostError, HttpError(503, "unavailable_error", "rpc_worker_lost")),
    (
        EngineNotReadyError,
        HttpError(503, "unavailable_error", "model_loading", {"Retry-After": RETRY_AFTER_S}),
    ),
    (KVMemError, HttpError(500, "server_error", "internal_error")),
)
_INTERNAL = HttpError(500, "server_error", "internal_error")
# 5xx errors that are no server fault, or that the engine worker has logged already
_LOGGED_ELSEWHERE = (QueueFullError, EngineNotReadyError, JobCrashedError)


def classify(exc: BaseException) -> HttpError:
    for kind, error in _BY_TYPE:
        if isinstance(exc, kind):
            return error
    return _INTERNAL


def error_payload(exc: BaseException) -> tuple[HttpError, dict[str, Any]]:
    """The HTTP status/headers and the envelope for `exc`."""
    error = classify(exc)
    message = str(exc) if isinstance(exc, KVMemError) else "internal server error"
    param = getattr(exc, "param", None)
    body: dict[str, Any] = {
        "message": message,
        "type": error.type,
        "param": param,
        "code": error.code,
    }
    if isinstance(exc, ContextLengthExceededError):  # llama-server's fields besides OpenAI's code
        body["n_prompt_tokens"] = exc.n_tokens
        body["n_ctx"] = exc.n_ctx
    return error, {"error": body}


def error_response(exc: BaseException) -> JSONResponse:
    error, body = error_payload(exc)
    if error.status >= 500 and not isinstance(exc, _LOGGED_ELSEWHERE):
        logger.error("request failed: %s: %s", type(exc).__name__, exc)
    return JSONResponse(body, status_code=error.status, headers=error.headers)


def failed_response(exc: BaseException) -> JSONResponse:
    """The response for a job the engine worker failed (it has logged and counted it)."""
    error, body = error_payload(exc)
    return JSONResponse(body, status_code=error.status, headers=error.headers)


def envelope(status: int, message: str, type_: str, code: str | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": type_, "param": None, "code": code}}
    return JSONResponse(body, status_code=status)


def install_error_handlers(app: FastAPI) -> None:
    async def on_kvmem_error(_: Request, exc: Exception) -> JSONResponse:
        return error_response(exc)

    async def on_http_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return envelope(exc.status_code, str(exc.detail), kind)

    async def on_validation_error(_: Request, exc: Exception) -> JSONResponse:
        return envelope(400, f"invalid request: {exc}", "invalid_request_error", "invalid_request")

    app.add_exception_handler(KVMemError, on_kvmem_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    # Any other exception is a bug: BodyGuard (server/body_guard.py) logs it once with its
    # traceback, counts it in kvmem_requests_failed_total and answers 500 in the envelope.


# The Anthropic Messages API's envelope, by HTTP status (server/anthropic_api.py).
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def anthropic_payload(exc: BaseException) -> tuple[HttpError, dict[str, Any]]:
    """The status/headers and `{"type": "error", "error": {"type", "message"}}` for `exc`."""
    error = classify(exc)
    message = str(exc) if isinstance(exc, KVMemError) else "internal server error"
    kind = anthropic_error_type(error.status)
    return error, {"type": "error", "error": {"type": kind, "message": message}}


def anthropic_error_type(status: int) -> str:
    return _ANTHROPIC_TYPES.get(status, "api_error")


def anthropic_response(exc: BaseException) -> JSONResponse:
    error, body = anthropic_payload(exc)
    if error.status >= 500 and not isinstance(exc, _LOGGED_ELSEWHERE):
        logger.error("request failed: %s: %s", type(exc).__name__, exc)
    return JSONResponse(body, status_code=error.status, headers=error.headers)
