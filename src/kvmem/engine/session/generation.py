"""A turn's generation stage: sample, yield, decode; plainly or with drafts verified
alongside (spec/spec_decode.py), the reserve's oldest blocks spilling as it fills."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import numpy as np

from ..llama.sampler import Sampler
from ..spec.spec_decode import SpecDecoder
from ..trace import FinishReason, TurnStats
from .decode import decode_tokens
from .parts import SessionParts


class Generation:
    """One generation after the prefill; `finish` and `t0` tell the turn's end how it went
    (`finish` is CANCELLED while a token is out with the consumer: closing the iterator
    there cancels the turn)."""

    def __init__(
        self,
        parts: SessionParts,
        spec: SpecDecoder | None,  # the session's (a test may swap it)
        sampler: Sampler,
        stats: TurnStats,
        max_tokens: int,
        cancel: threading.Event | None,
        logits_out: list[np.ndarray] | None,
    ) -> None:
        self.parts = parts
        self.spec = spec
        self.sampler = sampler
        self.stats = stats
        self.max_tokens = max_tokens
        self.cancel = cancel
        self.logits_out = logits_out
        self.finish = FinishReason.STOP
        self.t0: float | None = None  # when decoding started (None: it did not)

    def tokens(self) -> Iterator[int]:
        p, stats = self.parts, self.stats
        gen_start = p.table.n_tokens
        self.t0 = time.perf_counter()
        queue: list[int] = []  # tokens a draft verification emitted, not yet yielded
        while True:
            if self.cancel is not None and self.cancel.is_set():
                self.finish = FinishReason.CANCELLED
                return
            token = queue.pop(0) if queue else self._sample()
            if p.is_eog(token):
                return
            self.finish = FinishReason.CANCELLED  # if the consumer stops at this yield
            yield token
            stats.generated_tokens += 1
            self.finish = FinishReason.STOP
            if stats.generated_tokens == self.max_tokens or p.table.n_tokens + 1 >= p.n_ctx:
                self.finish = FinishReason.LENGTH
                return
            if not queue:  # else an accepted draft token: its cell is in the cache
                queue = self._step(token, gen_start)

    def _sample(self) -> int:
        ctx = self.parts.ctx
        if self.logits_out is not None:
            self.logits_out.append(ctx.logits(-1))
        return self.sampler.sample(ctx.ptr, -1)

    def _step(self, token: int, gen_start: int) -> list[int]:
        """Decode the token just sampled: plainly, or with drafts verified alongside (the
        tokens that verification emitted)."""
        p, stats = self.parts, self.stats
        if self.spec is None:
            decode_tokens(p.runner, [token], stats, gen_start=gen_start)
            return []
        left = -1 if self.max_tokens < 0 else self.max_tokens - stats.generated_tokens
        return self.spec.step(
            p.spec_target,
            self.sampler,
            token,
            stats,
            gen_start,
            left,
            self.logits_out,
            p.is_eog,
        )
