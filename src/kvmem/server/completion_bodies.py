"""Response bodies of `/completion` (llama-server's fields) and `/v1/completions` (OpenAI)."""

from __future__ import annotations

import math
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from kvmem.chat.protocol import ChatEngine
from kvmem.sampling import SamplingParams
from kvmem.server.chat_bodies import timings_body, usage_body
from kvmem.server.completion_job import CompletionDone, CompletionToken, StopType, TokenProb
from kvmem.server.props import system_fingerprint


def _piece(vocab: ChatEngine, token: int) -> tuple[str, list[int]]:
    data = vocab.token_bytes(token)
    return data.decode("utf-8", "replace"), list(data)


def _prob_entry(vocab: ChatEngine, p: TokenProb, post: bool) -> dict[str, Any]:
    text, data = _piece(vocab, p.id)
    entry: dict[str, Any] = {"id": p.id, "token": text, "bytes": data}
    if post:
        entry["prob"] = math.exp(p.logprob) if p.logprob > float("-inf") else 0.0
    else:
        entry["logprob"] = p.logprob if p.logprob > float("-inf") else -1e30
    return entry


def probs_body(vocab: ChatEngine, token: CompletionToken, post: bool) -> dict[str, Any] | None:
    if token.probs is None:
        return None
    chosen, top = token.probs
    body = _prob_entry(vocab, chosen, post)
    body["top_probs" if post else "top_logprobs"] = [_prob_entry(vocab, p, post) for p in top]
    return body


@dataclass(slots=True)
class NativeShape:
    """Context that every `/completion` body repeats."""

    model: str
    prompt_text: str
    sampling: SamplingParams
    n_predict: int
    post_sampling: bool
    return_tokens: bool
    stop: tuple[str, ...]
    bans: tuple[int, ...] = ()

    def settings(self) -> dict[str, Any]:
        s = self.sampling
        return {
            "n_predict": self.n_predict,
            "seed": s.seed,
            "temperature": s.temperature,
            "top_k": s.top_k,
            "top_p": s.top_p,
            "min_p": s.min_p,
            "repeat_penalty": s.repeat_penalty,
            "repeat_last_n": s.repeat_last_n,
            "presence_penalty": s.presence_penalty,
            "frequency_penalty": s.frequency_penalty,
            "stop": list(self.stop),
            "adaptive_target": None,
            "adaptive_decay": None,
            "post_sampling_probs": self.post_sampling,
            "logit_bias": [{"token": t, "bias": None} for t in self.bans],  # null = -inf
        }


def native_chunk(shape: NativeShape, vocab: ChatEngine, token: CompletionToken) -> dict[str, Any]:
    body: dict[str, Any] = {
        "index": 0,
        "content": token.text,
        "tokens": [token.id] if token.id >= 0 else [],
        "stop": False,
        "id_slot": 0,
    }
    probs = probs_body(vocab, token, shape.post_sampling)
    if probs is not None:
        body["completion_probabilities"] = [probs]
    return body


def native_final(
    shape: NativeShape,
    vocab: ChatEngine,
    done: CompletionDone,
    tokens: list[CompletionToken],
    *,
    stream: bool,
) -> dict[str, Any]:
    content = "" if stream else "".join(t.text for t in tokens)
    body: dict[str, Any] = {
        "index": 0,
        "content": content,
        "tokens": [] if stream or not shape.return_tokens else list(done.tokens),
        "id_slot": 0,
        "stop": True,
        "model": shape.model,
        "tokens_predicted": done.usage.completion_tokens,
        "tokens_evaluated": done.usage.prompt_tokens,
        "generation_settings": shape.settings(),
        "prompt": shape.prompt_text,
        "has_new_line": "\n" in "".join(t.text for t in tokens),
        "truncated": False,
        "stop_type": done.stop_type.value,
        "stopping_word": done.stopping_word,
        "tokens_cached": done.usage.prompt_tokens + done.usage.completion_tokens,
        "timings": timings_body(done.usage),
    }
    if not stream:
        probs = [probs_body(vocab, t, shape.post_sampling) for t in tokens if t.probs is not None]
        if probs:
            body["completion_probabilities"] = probs
    return body


def pick_fields(body: dict[str, Any], fields: list[str]) -> dict[str, Any]:
    """llama-server's `response_fields`: only these, `a/b` reaching into nested objects."""
    out: dict[str, Any] = {}
    for name in fields:
        value: Any = body
        for part in name.split("/"):
            value = value.get(part) if isinstance(value, dict) else None
        out[name] = value
    return out


def finish_reason(stop_type: StopType) -> str:
    return "length" if stop_type is StopType.LIMIT else "stop"


@dataclass(slots=True)
class OpenAIShape:
    model: str
    logprobs: int | None  # top-N, or None
    id: str = field(default_factory=lambda: "cmpl-" + secrets.token_hex(12))
    created: int = field(default_factory=lambda: int(time.time()))

    def envelope(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": system_fingerprint(),
            "choices": choices,
            **extra,
        }

    def logprobs_body(
        self, vocab: ChatEngine, tokens: list[CompletionToken], offset: int = 0
    ) -> dict[str, Any] | None:
        if self.logprobs is None:
            return None
        out: dict[str, Any] = {
            "tokens": [],
            "token_logprobs": [],
            "top_logprobs": [],
            "text_offset": [],
        }
        for t in tokens:
            if t.probs is None:
                continue
            chosen, top = t.probs
            out["tokens"].append(_piece(vocab, chosen.id)[0])
            out["token_logprobs"].append(chosen.logprob)
            out["top_logprobs"].append({_piece(vocab, p.id)[0]: p.logprob for p in top})
            out["text_offset"].append(offset)
            offset += len(t.text)
        return out

    def chunk(self, vocab: ChatEngine, token: CompletionToken) -> dict[str, Any]:
        choice = {
            "text": token.text,
            "index": 0,
            "logprobs": self.logprobs_body(vocab, [token]),
            "finish_reason": None,
        }
        return self.envelope([choice])

    def progress(self, body: dict[str, int]) -> dict[str, Any]:
        """A return_progress chunk: an empty text choice with `prompt_progress`."""
        choice = {"text": "", "index": 0, "logprobs": None, "finish_reason": None}
        return self.envelope([choice], prompt_progress=body)

    def final(
        self, vocab: ChatEngine, done: CompletionDone, tokens: list[CompletionToken], stream: bool
    ) -> dict[str, Any]:
        choice = {
            "text": "" if stream else "".join(t.text for t in tokens),
            "index": 0,
            "logprobs": None if stream else self.logprobs_body(vocab, tokens),
            "finish_reason": finish_reason(done.stop_type),
        }
        return self.envelope(
            [choice], usage=usage_body(done.usage), timings=timings_body(done.usage)
        )
