"""One chat turn for the APIs built on chat completions (Responses, Anthropic Messages).

Those APIs translate their request into a `/v1/chat/completions` body, so validation,
thinking controls, template rendering, tool grammars, prompt limits and the KVMem session
are exactly the chat route's. This module prepares the job, queues it and hands the turn
events back; the caller formats them in its own API's shape.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from kvmem.chat.prompt import tokenize_prompt
from kvmem.chat.turn import TurnDone, TurnEvent
from kvmem.server.channel import EventChannel, JobFailed, JobStarted
from kvmem.server.chat_job import ChatJob, prepare_chat_job
from kvmem.server.live_timings import TimingsSnapshot
from kvmem.server.prompt_limits import check_prompt_size, message_chars
from kvmem.server.props import served_model_id
from kvmem.server.routes import _next_event, _ready_state
from kvmem.server.schemas import ChatCompletionRequest

if TYPE_CHECKING:
    from kvmem.server.app import ServerState


class ClientGone(Exception):
    """The client disconnected while its turn waited or ran."""


@dataclass(slots=True)
class QueuedTurn:
    """A submitted job whose JobStarted has arrived."""

    request: Request
    state: ServerState
    job: ChatJob
    prompt_tokens: int
    model: str

    async def events(self) -> AsyncIterator[TurnEvent]:
        """The turn's events up to TurnDone; raises the job's error, or ClientGone."""
        try:
            while True:
                event = await _next_event(self.request, self.job.channel, self.job, self.state)
                if event is None:
                    raise ClientGone()
                if isinstance(event, JobFailed):
                    raise event.error
                if isinstance(event, TimingsSnapshot):
                    continue
                yield event
                if isinstance(event, TurnDone):
                    return
        finally:
            self.job.cancel.set()  # a no-op after TurnDone; stops generation otherwise


def prepare(
    request: Request, chat: ChatCompletionRequest, loop: asyncio.AbstractEventLoop
) -> tuple[ServerState, ChatJob]:
    """Validate and render like the chat route (400s before the job is queued); runs in a
    worker thread (`loop` is the request's event loop)."""
    state = _ready_state(request)
    assert state.template is not None and state.info is not None
    check_prompt_size(message_chars(chat.messages), state.info)
    job = prepare_chat_job(chat, state.settings, state.template, EventChannel(loop))
    check_prompt_size(len(job.rendered.text), state.info)
    return state, job


async def count_tokens(request: Request, chat: ChatCompletionRequest) -> int:
    """The rendered prompt's token count (the vocabulary only: no generation slot)."""
    loop = asyncio.get_running_loop()

    def count() -> int:
        state, job = prepare(request, chat, loop)
        assert state.vocab is not None
        return len(tokenize_prompt(state.vocab, job.rendered).tokens)

    return await run_in_threadpool(count)


async def start_turn(request: Request, chat: ChatCompletionRequest) -> QueuedTurn:
    """Queue the turn and wait until it starts; raises its error, or ClientGone."""
    state, job = await run_in_threadpool(prepare, request, chat, asyncio.get_running_loop())
    assert state.info is not None
    state.worker.submit(job)
    first: Any = await _next_event(request, job.channel, job, state)
    if first is None:
        raise ClientGone()
    if isinstance(first, JobFailed):
        raise first.error
    assert isinstance(first, JobStarted)
    model = served_model_id(state.settings, state.info)
    return QueuedTurn(request, state, job, first.prompt_tokens, model)
