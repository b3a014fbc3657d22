"""llama-server's utility endpoints: `/tokenize`, `/detokenize`, `/apply-template`,
`/chat/completions/input_tokens` and `GET /slots` (the slot actions are in slot_routes.py).

Tokenization reads the model's vocabulary in a worker thread (the event loop keeps
answering /health), after the same size pre-check as chat; it never waits for the
generation slot.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from kvmem.errors import InvalidRequestError
from kvmem.server.chat_flow import prompt_token_count, rendered_chat
from kvmem.server.completion_schema import prompt_parts
from kvmem.server.error_map import envelope
from kvmem.server.flow import read_json
from kvmem.server.prompt_limits import check_id_count, check_parts_size
from kvmem.server.prompt_tokens import check_ids, plain_tokens, tokenize_parts
from kvmem.server.schemas import parse_chat_request
from kvmem.server.state import ServerState, ready_state

utility_router = APIRouter()


async def _body(request: Request) -> dict[str, Any]:
    body = await read_json(request)
    if not isinstance(body, dict):
        raise InvalidRequestError("the request body must be a JSON object")
    return body


def _state(request: Request) -> ServerState:
    state = ready_state(request)
    assert state.vocab is not None and state.template is not None and state.info is not None
    return state


def _flag(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise InvalidRequestError(f"'{name}' must be a boolean", name)
    return value


@utility_router.post("/tokenize")
async def tokenize(request: Request) -> JSONResponse:
    body = await _body(request)
    state = _state(request)
    return JSONResponse(await run_in_threadpool(_tokenize, state, body))


def _tokenize(state: ServerState, body: dict[str, Any]) -> dict[str, Any]:
    vocab, info = state.vocab, state.info
    assert vocab is not None and info is not None
    add_special = _flag(body, "add_special", False)
    parse_special = _flag(body, "parse_special", True)
    with_pieces = _flag(body, "with_pieces", False)
    if "content" not in body:
        return {"tokens": []}
    content = body["content"]
    parts = prompt_parts(content)
    if len(parts) != 1:
        raise InvalidRequestError("'content' must be one prompt", "content")
    check_parts_size(parts[0], info)
    check_ids(parts[0], info.n_vocab, "content")
    if isinstance(content, str) and not parse_special:
        tokens = vocab.tokenize(content, add_special=add_special, parse_special=False)
    else:
        tokens = tokenize_parts(vocab, parts[0]) if add_special else plain_tokens(vocab, parts[0])
    if not with_pieces:
        return {"tokens": tokens}
    out = []
    for token in tokens:
        data = vocab.token_bytes(token)
        try:
            piece: Any = data.decode("utf-8")
        except UnicodeDecodeError:
            piece = list(data)
        out.append({"id": token, "piece": piece})
    return {"tokens": out}


@utility_router.post("/detokenize")
async def detokenize(request: Request) -> JSONResponse:
    body = await _body(request)
    state = _state(request)
    assert state.info is not None
    tokens = body.get("tokens", [])
    if not isinstance(tokens, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in tokens
    ):
        raise InvalidRequestError("'tokens' must be a list of token ids", "tokens")
    check_id_count(len(tokens), state.info)
    bad = [t for t in tokens if not 0 <= t < state.info.n_vocab]
    if bad:
        raise InvalidRequestError(f"token id {bad[0]} is out of range", "tokens")
    return JSONResponse({"content": await run_in_threadpool(_detokenize, state, tokens)})


def _detokenize(state: ServerState, tokens: list[int]) -> str:
    vocab = state.vocab
    assert vocab is not None
    return b"".join(vocab.token_bytes(t) for t in tokens).decode("utf-8", "replace")


def _render(state: ServerState, body: dict[str, Any]) -> str:
    return rendered_chat(state, parse_chat_request(body)).text


@utility_router.post("/apply-template")
async def apply_template(request: Request) -> JSONResponse:
    body = await _body(request)
    state = _state(request)
    prompt = await run_in_threadpool(_render, state, body)
    return JSONResponse({"prompt": prompt})


@utility_router.post("/chat/completions/input_tokens")
@utility_router.post("/v1/chat/completions/input_tokens")
async def chat_input_tokens(request: Request) -> JSONResponse:
    body = await _body(request)
    state = _state(request)
    return JSONResponse({"input_tokens": await run_in_threadpool(_input_tokens, state, body)})


def _input_tokens(state: ServerState, body: dict[str, Any]) -> int:
    return prompt_token_count(state, rendered_chat(state, parse_chat_request(body)))


@utility_router.get("/slots")
async def slots(request: Request) -> JSONResponse:
    state = _state(request)
    if not state.settings.slots_endpoint:
        return envelope(
            501,
            "This server does not support slots endpoint. Start it with `--slots`",
            "not_supported_error",
        )
    assert state.info is not None
    slots = [
        {
            "id": i,
            "id_task": -1,
            "n_ctx": state.info.n_ctx,
            "speculative": False,
            "is_processing": busy,
            "kvmem": True,
        }
        for i, busy in enumerate(state.worker.lanes_busy())
    ]
    return JSONResponse(slots)
