"""`POST /completion` (llama-server) and `POST /v1/completions` (OpenAI): text completion.

Same KVMem session, queue and prefix reuse as chat. A batch of prompts runs one prompt
after another and answers a list (`/completion`) or one choice per prompt
(`/v1/completions`); streaming takes one prompt.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from kvmem.chat.json_grammar import json_schema_grammar
from kvmem.chat.protocol import ChatEngine
from kvmem.chat.schema_check import check_grammar_text
from kvmem.errors import InvalidRequestError
from kvmem.server.auth import require_api_key
from kvmem.server.channel import EventChannel, JobFailed, JobStarted
from kvmem.server.chat_job import sampling_for
from kvmem.server.completion_bodies import (
    NativeShape,
    OpenAIShape,
    native_chunk,
    native_final,
    pick_fields,
)
from kvmem.server.completion_job import CompletionDone, CompletionJob, CompletionToken
from kvmem.server.completion_schema import (
    CompletionRequest,
    PromptPart,
    parse_completion_request,
    prompt_parts,
)
from kvmem.server.disconnect import next_or_disconnect
from kvmem.server.error_map import error_payload
from kvmem.server.json_body import parse_json_body
from kvmem.server.live_timings import TimingProbe, TimingsSnapshot
from kvmem.server.logit_bias import banned_tokens
from kvmem.server.prompt_limits import check_parts_size
from kvmem.server.prompt_progress import (
    ProgressReporter,
    ProgressSnapshot,
    native_progress_chunk,
)
from kvmem.server.props import served_model_id
from kvmem.server.responses import SSE_DONE, sse_data
from kvmem.server.routes import _ready_state

if TYPE_CHECKING:
    from kvmem.server.app import ServerState

completion_router = APIRouter(dependencies=[Depends(require_api_key)])


def tokenize_parts(vocab: ChatEngine, parts: list[PromptPart]) -> list[int]:
    """Text pieces tokenized (BOS before a leading text, as llama.cpp adds it), ids kept."""
    info = vocab.info
    tokens: list[int] = []
    for i, part in enumerate(parts):
        if isinstance(part, str):
            text = part
            if i == 0 and info.add_bos:
                if info.bos_text and text.startswith(info.bos_text):
                    text = text[len(info.bos_text) :]
                tokens.append(info.bos_token_id)
            tokens += vocab.tokenize(text, add_special=False, parse_special=True)
        else:
            bad = [t for t in part if not 0 <= t < info.n_vocab]
            if bad:
                raise InvalidRequestError(
                    f"token id {bad[0]} is out of range (vocabulary of {info.n_vocab})", "prompt"
                )
            tokens += part
    if not tokens:
        raise InvalidRequestError("the prompt is empty", "prompt")
    return tokens


def _json_body(raw: bytes) -> Any:
    return parse_json_body(raw)  # depth, number-size and surrogate limits before pydantic


def _grammar(r: CompletionRequest) -> str | None:
    if r.grammar is not None:
        check_grammar_text(r.grammar)
        return r.grammar
    if r.json_schema is not None:
        return json_schema_grammar(r.json_schema, "json_schema")
    return None


def _jobs(
    state: ServerState, r: CompletionRequest, channel_for: Any, *, openai: bool
) -> list[tuple[CompletionJob, str]]:
    vocab = state.vocab
    assert vocab is not None
    first, second = (r.max_tokens, r.n_predict) if openai else (r.n_predict, r.max_tokens)
    asked = first if first is not None else second  # neither: the server's -n
    caps = [v for v in (asked, state.settings.n_predict) if v is not None and v > 0]
    max_tokens = min(caps) if caps else (-1 if asked in (None, -1) else 0)
    sampling = sampling_for(r, state.settings.sampling)  # type: ignore[arg-type]
    if r.repeat_last_n is not None:
        sampling = replace(sampling, repeat_last_n=r.repeat_last_n)
    n_probs = r.n_probs or 0
    if openai and r.logprobs is not None and r.logprobs is not False:
        n_probs = 1 if r.logprobs is True else max(1, int(r.logprobs))
    banned = banned_tokens(vocab, r.logit_bias)
    batch = prompt_parts(r.prompt)
    for parts in batch:
        check_parts_size(parts, vocab.info)  # before any tokenization
    jobs = []
    for parts in batch:
        tokens = tokenize_parts(vocab, parts)
        channel = channel_for()
        job = CompletionJob(
            tokens=tokens,
            sampling=sampling,
            channel=channel,
            max_tokens=max_tokens,
            stop=r.stop_list,
            n_probs=n_probs,
            post_sampling=r.post_sampling_probs,
            ignore_eos=r.ignore_eos,
            banned_tokens=banned,
            grammar=_grammar(r),
            timing_probe=TimingProbe() if r.timings_per_token and r.stream else None,
            progress=ProgressReporter(channel) if r.return_progress and r.stream else None,
            cache_prompt=r.cache_prompt,
        )
        jobs.append((job, _prompt_text(vocab, tokens)))
    bans = list(banned)
    if r.ignore_eos:
        bans += list(getattr(vocab, "eog_tokens", tuple)())
    for job, _ in jobs:
        job.reported_bans = tuple(dict.fromkeys(bans))
    if r.stream and len(jobs) > 1:
        raise InvalidRequestError("streaming takes one prompt, not a batch", "prompt")
    return jobs


def _prompt_text(vocab: ChatEngine, tokens: list[int]) -> str:
    return b"".join(vocab.token_bytes(t) for t in tokens).decode("utf-8", "replace")


async def _next(request: Request, job: CompletionJob) -> Any:
    alive, event = await next_or_disconnect(request, job.channel)
    if not alive:
        job.cancel.set()
    return event


async def _collect(request: Request, job: CompletionJob) -> tuple[list[CompletionToken], Any]:
    tokens: list[CompletionToken] = []
    while True:
        event = await _next(request, job)
        if event is None or isinstance(event, JobFailed | CompletionDone):
            return tokens, event
        if isinstance(event, CompletionToken):
            tokens.append(event)


async def _handle(request: Request, *, openai: bool) -> Response:
    r = parse_completion_request(_json_body(await request.body()))
    state = _ready_state(request)
    assert state.info is not None and state.vocab is not None
    loop = asyncio.get_running_loop()
    # tokenization and grammar checks off the event loop: /health keeps answering
    jobs = await run_in_threadpool(_jobs, state, r, lambda: EventChannel(loop), openai=openai)
    model = served_model_id(state.settings, state.info)
    effective = jobs[0][0].max_tokens
    shapes = [
        NativeShape(
            model,
            text,
            job.sampling,
            effective,
            r.post_sampling_probs,
            r.return_tokens,
            r.stop_list,
            job.reported_bans,
        )
        for job, text in jobs
    ]
    oai = OpenAIShape(model, None if r.logprobs in (None, False) else int(r.logprobs))
    if r.stream:
        job = jobs[0][0]
        state.worker.submit(job)
        first = await _next(request, job)
        if first is None:
            return Response(status_code=499)
        if isinstance(first, JobFailed):
            raise first.error
        assert isinstance(first, JobStarted)
        return StreamingResponse(
            _stream(request, job, state.vocab, shapes[0], oai if openai else None),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    results = []
    for job, _ in jobs:
        state.worker.submit(job)
        tokens, done = await _collect(request, job)
        if done is None:
            return Response(status_code=499)
        if isinstance(done, JobFailed):
            raise done.error
        results.append((tokens, done))
    if openai:
        bodies = [oai.final(state.vocab, done, tokens, False) for tokens, done in results]
        choices = []
        for i, b in enumerate(bodies):
            choices.append({**b["choices"][0], "index": i})
        merged = {**bodies[0], "choices": choices}
        return JSONResponse(merged)
    out = []
    for i, ((tokens, done), shape) in enumerate(zip(results, shapes, strict=True)):
        body = native_final(shape, state.vocab, done, tokens, stream=False)
        body["index"] = i
        out.append(pick_fields(body, r.response_fields) if r.response_fields else body)
    return JSONResponse(out[0] if len(out) == 1 else out)


async def _stream(
    request: Request,
    job: CompletionJob,
    vocab: ChatEngine,
    shape: NativeShape,
    oai: OpenAIShape | None,
) -> AsyncIterator[str]:
    try:
        tokens: list[CompletionToken] = []
        live: dict[str, Any] | None = None  # timings_per_token
        while True:
            event = await _next(request, job)
            if event is None:
                return
            if isinstance(event, TimingsSnapshot):
                live = event.body
                continue
            if isinstance(event, ProgressSnapshot):  # return_progress
                yield sse_data(
                    oai.progress(event.body) if oai else native_progress_chunk(event.body)
                )
                continue
            if isinstance(event, JobFailed):
                _, body = error_payload(event.error)
                yield sse_data(body)
                break
            if isinstance(event, CompletionToken):
                tokens.append(event)
                if oai is not None and not event.text:
                    continue
                body = (
                    oai.chunk(vocab, event)
                    if oai is not None
                    else native_chunk(shape, vocab, event)
                )
                if live is not None:
                    body["timings"] = live
                yield sse_data(body)
            elif isinstance(event, CompletionDone):
                if oai is not None:
                    yield sse_data(oai.final(vocab, event, tokens, True))
                else:
                    yield sse_data(native_final(shape, vocab, event, tokens, stream=True))
                break
        if oai is not None:
            yield SSE_DONE
    finally:
        job.cancel.set()


@completion_router.post("/completion")
@completion_router.post("/completions")
async def completion(request: Request) -> Response:
    return await _handle(request, openai=False)


@completion_router.post("/v1/completions")
async def v1_completions(request: Request) -> Response:
    return await _handle(request, openai=True)
