"""Text completion (`/completion`, `/v1/completions`) as a job for the engine worker.

The prompt is tokenized in the request handler (text with BOS as llama.cpp adds it, or
token ids as given) and generated on the same KVMem session as chat, so the reuse of a
matching prefix works across both APIs. Per token the job yields `CompletionToken` (the
id, the text it completed after stop strings, and its probabilities with `n_probs`), and
finally `CompletionDone`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np

from kvmem.chat.detokenize import IncrementalDetokenizer
from kvmem.chat.logprobs import TokenProb, token_probs
from kvmem.chat.protocol import ChatEngine
from kvmem.chat.stop import StopMatcher
from kvmem.chat.turn import TurnUsage
from kvmem.errors import ContextLengthExceededError
from kvmem.sampling import SamplingParams
from kvmem.server.channel import EventChannel, JobStarted
from kvmem.server.live_timings import TimingProbe
from kvmem.server.prompt_progress import ProgressReporter


class StopType(Enum):
    NONE = "none"  # cancelled
    EOS = "eos"
    WORD = "word"
    LIMIT = "limit"


@dataclass(slots=True)
class CompletionToken:
    id: int
    text: str
    probs: tuple[TokenProb, tuple[TokenProb, ...]] | None = None  # (chosen, top n)


@dataclass(slots=True)
class CompletionDone:
    stop_type: StopType
    stopping_word: str
    usage: TurnUsage
    tokens: list[int]


@dataclass(slots=True)
class CompletionJob:
    tokens: list[int]
    sampling: SamplingParams
    channel: EventChannel
    max_tokens: int = -1
    stop: tuple[str, ...] = ()
    n_probs: int = 0
    post_sampling: bool = False
    ignore_eos: bool = False
    banned_tokens: tuple[int, ...] = ()
    grammar: str | None = None
    reported_bans: tuple[int, ...] = ()  # generation_settings.logit_bias (with ignore_eos' EOG)
    timing_probe: TimingProbe | None = None  # timings_per_token
    progress: ProgressReporter | None = None  # return_progress
    cache_prompt: bool = True  # False: the session's history is not reused (all recomputed)
    conversation_id: str | None = None  # kvmem.conversation_id: the conversation it runs on
    cancel: threading.Event = field(default_factory=threading.Event)

    def run(self, engine: ChatEngine) -> Any:
        """Generate; yields JobStarted, CompletionToken..., CompletionDone."""
        n_ctx = engine.info.n_ctx
        if len(self.tokens) >= n_ctx:
            raise ContextLengthExceededError(len(self.tokens), n_ctx)
        yield JobStarted(len(self.tokens))
        if not self.cache_prompt:
            engine.reset()  # llama-server's cache_prompt: false: nothing of the history is reused
        if self.max_tokens == 0:  # prefill only: the prompt's KV is kept, nothing sampled
            yield self._prefill_only(engine)
            return
        detok = IncrementalDetokenizer(engine)
        stopper = StopMatcher(self.stop)
        logits: list[np.ndarray] | None = [] if self.n_probs > 0 else None
        generated: list[int] = []
        stop_type = StopType.EOS
        stopping_word = ""
        gen = engine.generate(
            self.tokens,
            query=None,
            sampling=self.sampling,
            max_tokens=self.max_tokens,
            grammar=self.grammar,
            cancel=self.cancel,
            logits_out=logits,
            ignore_eos=self.ignore_eos,
            banned_tokens=self.banned_tokens,
        )
        try:
            for token in gen:
                generated.append(token)
                result = stopper.push(detok.push(token))
                probs = None
                if logits is not None and logits:
                    probs = token_probs(
                        logits[-1],
                        token,
                        self.n_probs,
                        self.sampling if self.post_sampling else None,
                    )
                yield CompletionToken(token, result.text, probs)
                if result.stopped:
                    stop_type = StopType.WORD
                    stopping_word = _which_stop(self.stop, detok, engine, generated)
                    break
        finally:
            gen.close()
        stats = engine.last_turn
        if stop_type is not StopType.WORD:
            tail = stopper.push(detok.flush())
            text = tail.text + stopper.flush()
            if text:
                yield CompletionToken(-1, text)
            if stats.finish_reason == "length":
                stop_type = StopType.LIMIT
            elif stats.finish_reason == "cancelled":
                stop_type = StopType.NONE
        usage = TurnUsage(
            prompt_tokens=len(self.tokens),
            cached_tokens=stats.cached_tokens,
            completion_tokens=len(generated),
            prefill_ms=stats.prefill_ms,
            decode_ms=stats.decode_ms,
        )
        usage.memory.draft_n = getattr(stats, "draft_n", 0)  # timings.draft_n (--spec-type)
        usage.memory.draft_n_accepted = getattr(stats, "draft_n_accepted", 0)
        yield CompletionDone(stop_type, stopping_word, usage, generated)

    def _prefill_only(self, engine: ChatEngine) -> CompletionDone:
        engine.teacher_force(self.tokens, ())
        stats = engine.last_turn
        usage = TurnUsage(
            prompt_tokens=len(self.tokens),
            cached_tokens=stats.cached_tokens,
            prefill_ms=stats.prefill_ms,
        )
        return CompletionDone(StopType.LIMIT, "", usage, [])


def _which_stop(
    stops: tuple[str, ...], detok: IncrementalDetokenizer, engine: ChatEngine, tokens: list[int]
) -> str:
    text = engine.detokenize(tokens)
    found = [(text.find(s), s) for s in stops if s and s in text]
    return min(found)[1] if found else ""
