"""The one chat preparation: a chat request checked, rendered and queued as a job.

Chat completions, the Responses API and Anthropic Messages (which translate their
request into a chat request), and the chat utility routes (/apply-template, the
input_tokens routes) all prepare a chat here: the prompt-size pre-check on the messages,
template rendering (server/chat_job.py), tool grammars, logit_bias bans, then the size
check on the rendered prompt, so a bad request fails with its 400 before it is queued.
The template and grammar work runs in a worker thread, off the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from kvmem.chat.prompt import RenderedPrompt, tokenize_prompt
from kvmem.chat.turn import TurnEvent
from kvmem.server.channel import EventChannel, JobStarted
from kvmem.server.chat_job import ChatJob, prepare_chat_job, render_chat
from kvmem.server.flow import Submitted, sse_stream, submit
from kvmem.server.logit_bias import banned_tokens
from kvmem.server.prompt_limits import check_prompt_size, message_chars
from kvmem.server.schemas import ChatCompletionRequest
from kvmem.server.sse import sse_event
from kvmem.server.state import ServerState


def check_messages(state: ServerState, chat: ChatCompletionRequest) -> None:
    """The size pre-check on the messages, before any template work."""
    assert state.info is not None
    check_prompt_size(message_chars(chat.messages), state.info)


def prepare_chat(
    state: ServerState, chat: ChatCompletionRequest, loop: asyncio.AbstractEventLoop
) -> ChatJob:
    """The chat request as a job (in a worker thread; `loop` is the request's event loop)."""
    assert state.template is not None and state.info is not None
    check_messages(state, chat)
    job = prepare_chat_job(chat, state.settings, state.template, EventChannel(loop))
    if chat.logit_bias is not None and state.vocab is not None:
        job.banned_tokens = banned_tokens(state.vocab, chat.logit_bias)
    check_prompt_size(len(job.rendered.text), state.info)
    return job


def prepare_choices(
    state: ServerState, chat: ChatCompletionRequest, loop: asyncio.AbstractEventLoop
) -> list[ChatJob]:
    """One job per choice (`n`), all from the one rendering, each with its own channel."""
    first = prepare_chat(state, chat, loop)
    return [first] + [first.another_choice(EventChannel(loop)) for _ in range((chat.n or 1) - 1)]


def rendered_chat(state: ServerState, chat: ChatCompletionRequest) -> RenderedPrompt:
    """The chat's prompt as the template renders it, without images or a job
    (/apply-template, input_tokens); the same checks as a chat job."""
    assert state.template is not None and state.info is not None
    check_messages(state, chat)
    rendered = render_chat(chat, state.settings, state.template).prompt
    check_prompt_size(len(rendered.text), state.info)
    return rendered


def prompt_token_count(state: ServerState, rendered: RenderedPrompt) -> int:
    """The rendered prompt's token count (the vocabulary only: the template's markup is
    special, the messages' text is not)."""
    assert state.vocab is not None
    return len(tokenize_prompt(state.vocab, rendered).tokens)


async def count_chat_tokens(state: ServerState, chat: ChatCompletionRequest) -> int:
    """The prompt tokens the chat job would have (no generation slot)."""
    loop = asyncio.get_running_loop()

    def count() -> int:
        return prompt_token_count(state, prepare_chat(state, chat, loop).rendered)

    return await run_in_threadpool(count)


@dataclass(slots=True)
class ChatTurn:
    """A queued chat job whose JobStarted has arrived."""

    submitted: Submitted
    prompt_tokens: int
    model: str

    def events(self) -> AsyncIterator[TurnEvent]:
        """The turn's events up to TurnDone; raises the job's error, or ClientGoneError."""
        return self.submitted.events()


async def start_chat(request: Request, state: ServerState, chat: ChatCompletionRequest) -> ChatTurn:
    """Prepare, queue and wait until the turn starts; raises its error, or ClientGoneError."""
    job = await run_in_threadpool(prepare_chat, state, chat, asyncio.get_running_loop())
    submitted = submit(request, state, job)
    first = await submitted.first()
    assert isinstance(first, JobStarted)
    return ChatTurn(submitted, first.prompt_tokens, state.model_id)


class EventBuilder(Protocol):
    """Turns a chat turn's events into one API's bodies (responses_events, anthropic_events)."""

    def start(self) -> list[dict[str, Any]]: ...

    def push(self, event: TurnEvent) -> list[dict[str, Any]]: ...


async def collect(turn: ChatTurn, builder: EventBuilder) -> None:
    """Feed the whole turn to `builder`; raises the job's error, or ClientGoneError."""
    async for event in turn.events():
        builder.push(event)


@dataclass(slots=True)
class NamedEvents:
    """A builder's bodies as named SSE events (flow.StreamFormat): a job that fails after
    the stream began ends it with `error_event(exc)`, in the API's own envelope; `after`
    runs once the turn completed (the Responses API stores the response)."""

    builder: EventBuilder
    error_event: Callable[[Exception], dict[str, Any]]
    after: Callable[[], None] | None = None

    def head(self) -> list[str]:
        return [sse_event(body) for body in self.builder.start()]

    def lines(self, event: TurnEvent) -> list[str]:
        return [sse_event(body) for body in self.builder.push(event)]

    def error(self, exc: Exception) -> list[str]:
        return [sse_event(self.error_event(exc))]

    def tail(self) -> list[str]:
        if self.after is not None:
            self.after()
        return []


def event_stream(turn: ChatTurn, fmt: NamedEvents) -> Response:
    """The turn as named server-sent events."""
    return sse_stream(turn.submitted, fmt)
