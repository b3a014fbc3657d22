"""llama-server's utility endpoints: `/tokenize`, `/detokenize`, `/apply-template`,
`/chat/completions/input_tokens` and `GET /slots` (the slot actions are in slot_routes.py).

Tokenization reads the model's vocabulary in a worker thread (the event loop keeps
answering /health), after the same size pre-check as chat; it never waits for the
generation slot.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from kvmem.chat.messages import normalize_messages
from kvmem.chat.prefill import plan_prefill
from kvmem.chat.prompt import RenderedPrompt, render_prompt, tokenize_prompt
from kvmem.chat.thinking import resolve_thinking
from kvmem.errors import InvalidRequestError
from kvmem.server.auth import require_api_key
from kvmem.server.completion_routes import tokenize_parts
from kvmem.server.completion_schema import prompt_parts
from kvmem.server.error_map import envelope
from kvmem.server.json_body import parse_json_body
from kvmem.server.prompt_limits import (
    check_id_count,
    check_parts_size,
    check_prompt_size,
    message_chars,
)
from kvmem.server.routes import _ready_state
from kvmem.server.schemas import parse_chat_request

if TYPE_CHECKING:
    from kvmem.server.app import ServerState

utility_router = APIRouter(dependencies=[Depends(require_api_key)])


async def _body(request: Request) -> dict[str, Any]:
    body = parse_json_body(await request.body())
    if not isinstance(body, dict):
        raise InvalidRequestError("the request body must be a JSON object")
    return body


def _state(request: Request) -> ServerState:
    state = _ready_state(request)
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
    _check_ids(parts[0], info.n_vocab, "content")
    if isinstance(content, str) and not parse_special:
        tokens = vocab.tokenize(content, add_special=add_special, parse_special=False)
    else:
        tokens = tokenize_parts(vocab, parts[0]) if add_special else _plain(vocab, parts[0])
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


def _check_ids(parts: list[Any], n_vocab: int, param: str) -> None:
    for part in parts:
        if isinstance(part, str):
            continue
        bad = [t for t in part if not 0 <= t < n_vocab]
        if bad:
            raise InvalidRequestError(
                f"token id {bad[0]} is out of range (vocabulary of {n_vocab})", param
            )


def _plain(vocab: Any, parts: list[Any]) -> list[int]:
    tokens: list[int] = []
    for part in parts:
        if isinstance(part, str):
            tokens += vocab.tokenize(part, add_special=False, parse_special=True)
        else:
            tokens += part
    return tokens


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


def _rendered(
    state: ServerState, body: dict[str, Any], add_generation_prompt: bool | None
) -> RenderedPrompt:
    chat = parse_chat_request(body)
    assert state.template is not None and state.info is not None
    check_prompt_size(message_chars(chat.messages), state.info)  # the chat route's checks
    messages = normalize_messages(chat.messages, vision=False)
    plan = resolve_thinking(
        state.settings.thinking,
        reasoning_effort=chat.reasoning_effort,
        chat_template_kwargs=chat.chat_template_kwargs,
        reasoning_budget_tokens=chat.reasoning_budget_tokens,
    )
    tools = chat.tool_dicts if chat.tool_choice != "none" else []
    prefill = plan_prefill(
        chat.messages,
        messages,
        add_generation_prompt=add_generation_prompt,
        continue_final_message=chat.continue_final_message,
    )
    rendered = render_prompt(
        state.template,
        prefill.messages,
        tools=tools or None,
        template_kwargs=plan.template_kwargs,
        add_generation_prompt=prefill.add_generation_prompt,
        prefill=prefill.text,
    )
    check_prompt_size(len(rendered.text), state.info)
    return rendered


def _render(state: ServerState, body: dict[str, Any], add_generation_prompt: bool | None) -> str:
    return _rendered(state, body, add_generation_prompt).text


@utility_router.post("/apply-template")
async def apply_template(request: Request) -> JSONResponse:
    body = await _body(request)
    state = _state(request)
    prompt = await run_in_threadpool(_render, state, body, body.get("add_generation_prompt"))
    return JSONResponse({"prompt": prompt})


@utility_router.post("/chat/completions/input_tokens")
@utility_router.post("/v1/chat/completions/input_tokens")
async def chat_input_tokens(request: Request) -> JSONResponse:
    body = await _body(request)
    state = _state(request)
    return JSONResponse({"input_tokens": await run_in_threadpool(_input_tokens, state, body)})


def _input_tokens(state: ServerState, body: dict[str, Any]) -> int:
    rendered = _rendered(state, body, body.get("add_generation_prompt"))
    assert state.vocab is not None
    return len(tokenize_prompt(state.vocab, rendered).tokens)  # the template's markup is special


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
