"""`POST /completion` (llama-server) and `POST /v1/completions` (OpenAI): text completion.

Same KVMem session, queue and prefix reuse as chat. A batch of prompts runs one prompt
after another and answers a list (`/completion`) or one choice per prompt
(`/v1/completions`); streaming takes one prompt.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from kvmem.chat.protocol import ChatEngine
from kvmem.server.completion_bodies import (
    NativeShape,
    OpenAIShape,
    native_chunk,
    native_final,
    pick_fields,
)
from kvmem.server.completion_flow import PreparedPrompt, prepare_completion
from kvmem.server.completion_job import CompletionDone, CompletionToken
from kvmem.server.completion_schema import CompletionRequest, parse_completion_request
from kvmem.server.error_map import error_payload
from kvmem.server.flow import Submitted, read_json, sse_stream, submit
from kvmem.server.live_timings import TimingsSnapshot
from kvmem.server.prompt_progress import ProgressSnapshot, native_progress_chunk
from kvmem.server.sse import SSE_DONE, sse_data
from kvmem.server.state import ServerState, ready_state

completion_router = APIRouter()


async def _handle(request: Request, *, openai: bool) -> Response:
    r = parse_completion_request(await read_json(request))
    state = ready_state(request)
    assert state.info is not None and state.vocab is not None
    loop = asyncio.get_running_loop()
    # tokenization and grammar checks off the event loop: /health keeps answering
    prompts = await run_in_threadpool(lambda: prepare_completion(state, r, loop, openai=openai))
    shapes = [_shape(state, r, p) for p in prompts]
    oai = OpenAIShape(state.model_id, None if r.logprobs in (None, False) else int(r.logprobs))
    if r.stream:
        submitted = submit(request, state, prompts[0].job)
        await submitted.first()  # JobStarted: a job refused before it starts is a status
        fmt = _TokenStream(state.vocab, shapes[0], oai if openai else None)
        return sse_stream(submitted, fmt, timings=True)
    results = [await _collect(submit(request, state, p.job)) for p in prompts]
    if openai:
        bodies = [oai.final(state.vocab, done, tokens, False) for tokens, done in results]
        choices = [{**b["choices"][0], "index": i} for i, b in enumerate(bodies)]
        return JSONResponse({**bodies[0], "choices": choices})
    out = []
    for i, ((tokens, done), shape) in enumerate(zip(results, shapes, strict=True)):
        body = native_final(shape, state.vocab, done, tokens, stream=False)
        body["index"] = i
        out.append(pick_fields(body, r.response_fields) if r.response_fields else body)
    return JSONResponse(out[0] if len(out) == 1 else out)


def _shape(state: ServerState, r: CompletionRequest, prompt: PreparedPrompt) -> NativeShape:
    job = prompt.job
    return NativeShape(
        state.model_id,
        prompt.text,
        job.sampling,
        job.max_tokens,
        r.post_sampling_probs,
        r.return_tokens,
        r.stop_list,
        job.reported_bans,
    )


async def _collect(submitted: Submitted) -> tuple[list[CompletionToken], CompletionDone]:
    tokens: list[CompletionToken] = []
    async for event in submitted.events():
        if isinstance(event, CompletionToken):
            tokens.append(event)
        elif isinstance(event, CompletionDone):
            return tokens, event
    raise AssertionError("a completion job ends with CompletionDone")  # pragma: no cover


@dataclass(slots=True)
class _TokenStream:
    """Completion tokens as SSE lines (flow.StreamFormat): llama-server's chunks, or
    OpenAI's (`oai`) ending with [DONE]."""

    vocab: ChatEngine
    shape: NativeShape
    oai: OpenAIShape | None
    tokens: list[CompletionToken] = field(default_factory=list)
    live: dict[str, Any] | None = None  # timings_per_token

    def head(self) -> list[str]:
        return []

    def lines(self, event: Any) -> list[str]:
        if isinstance(event, TimingsSnapshot):
            self.live = event.body
            return []
        if isinstance(event, ProgressSnapshot):  # return_progress
            body = self.oai.progress(event.body) if self.oai else native_progress_chunk(event.body)
            if event.timings is not None:  # timings_per_token
                body["timings"] = event.timings
            return [sse_data(body)]
        if isinstance(event, CompletionDone):
            if self.oai is not None:
                return [sse_data(self.oai.final(self.vocab, event, self.tokens, True))]
            return [sse_data(native_final(self.shape, self.vocab, event, self.tokens, stream=True))]
        assert isinstance(event, CompletionToken)
        self.tokens.append(event)
        if self.oai is not None and not event.text:
            return []
        body = (
            self.oai.chunk(self.vocab, event)
            if self.oai is not None
            else native_chunk(self.shape, self.vocab, event)
        )
        if self.live is not None:
            body["timings"] = self.live
        return [sse_data(body)]

    def error(self, exc: Exception) -> list[str]:
        return [sse_data(error_payload(exc)[1]), *self.tail()]

    def tail(self) -> list[str]:
        return [SSE_DONE] if self.oai is not None else []


@completion_router.post("/completion")
@completion_router.post("/completions")
async def completion(request: Request) -> Response:
    return await _handle(request, openai=False)


@completion_router.post("/v1/completions")
async def v1_completions(request: Request) -> Response:
    return await _handle(request, openai=True)
