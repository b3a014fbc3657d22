"""A text-completion request prepared as jobs (/completion, /v1/completions).

One job per prompt of the batch, all with the same sampling, limits, bans and grammar:
the size pre-check on every prompt before any tokenization, then the prompt's tokens
(server/prompt_tokens.py) and its text as llama-server echoes it. Runs in a worker
thread, off the event loop.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace

from kvmem.chat.json_grammar import json_schema_grammar
from kvmem.chat.protocol import ChatEngine
from kvmem.chat.schema_check import check_grammar_text
from kvmem.errors import InvalidRequestError
from kvmem.sampling import SamplingParams
from kvmem.server.channel import EventChannel
from kvmem.server.chat_job import output_limit, sampling_for
from kvmem.server.completion_job import CompletionJob
from kvmem.server.completion_schema import CompletionRequest, prompt_parts
from kvmem.server.kvmem_options import conversation_of
from kvmem.server.live_timings import TimingProbe
from kvmem.server.logit_bias import banned_tokens
from kvmem.server.prompt_limits import check_parts_size
from kvmem.server.prompt_progress import ProgressReporter
from kvmem.server.prompt_tokens import tokenize_parts
from kvmem.server.state import ServerState


@dataclass(slots=True)
class PreparedPrompt:
    """One prompt of the batch: its job and its text (the `prompt` field echoed back)."""

    job: CompletionJob
    text: str


def _grammar(r: CompletionRequest) -> str | None:
    if r.grammar is not None:
        check_grammar_text(r.grammar)
        return r.grammar
    if r.json_schema is not None:
        return json_schema_grammar(r.json_schema, "json_schema")
    return None


def _max_tokens(state: ServerState, r: CompletionRequest, openai: bool) -> int:
    first, second = (r.max_tokens, r.n_predict) if openai else (r.n_predict, r.max_tokens)
    asked = first if first is not None else second
    return output_limit(asked, state.settings.n_predict)


def _sampling(state: ServerState, r: CompletionRequest) -> SamplingParams:
    sampling = sampling_for(r, state.settings.sampling)  # type: ignore[arg-type]
    if r.repeat_last_n is not None:
        sampling = replace(sampling, repeat_last_n=r.repeat_last_n)
    return sampling


def _n_probs(r: CompletionRequest, openai: bool) -> int:
    if openai and r.logprobs is not None and r.logprobs is not False:
        return 1 if r.logprobs is True else max(1, int(r.logprobs))
    return r.n_probs or 0


def prepare_completion(
    state: ServerState, r: CompletionRequest, loop: asyncio.AbstractEventLoop, *, openai: bool
) -> list[PreparedPrompt]:
    """The batch's jobs; InvalidRequestError for a bad prompt, grammar or limit."""
    vocab = state.vocab
    assert vocab is not None
    banned = banned_tokens(vocab, r.logit_bias)
    batch = prompt_parts(r.prompt)
    for parts in batch:
        check_parts_size(parts, vocab.info)  # before any tokenization
    max_tokens, sampling, n_probs = (
        _max_tokens(state, r, openai),
        _sampling(state, r),
        _n_probs(r, openai),
    )
    bans = list(banned)
    if r.ignore_eos:
        bans += list(getattr(vocab, "eog_tokens", tuple)())
    prepared = []
    for parts in batch:
        tokens = tokenize_parts(vocab, parts)
        channel = EventChannel(loop)
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
            progress=(
                ProgressReporter(channel, timings=bool(r.timings_per_token))
                if r.return_progress and r.stream
                else None
            ),
            cache_prompt=r.cache_prompt,
            conversation_id=conversation_of(r.kvmem),
        )
        job.reported_bans = tuple(dict.fromkeys(bans))
        prepared.append(PreparedPrompt(job, _prompt_text(vocab, tokens)))
    if r.stream and len(prepared) > 1:
        raise InvalidRequestError("streaming takes one prompt, not a batch", "prompt")
    return prepared


def _prompt_text(vocab: ChatEngine, tokens: list[int]) -> str:
    return b"".join(vocab.token_bytes(t) for t in tokens).decode("utf-8", "replace")
