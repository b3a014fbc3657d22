"""`--grammar-deadline`: a grammar- or schema-constrained generation ends once it has run
that many seconds.

llama.cpp's grammar sampler cannot be interrupted inside a call, and some grammars that
pass the checks (kvmem.chat.grammar_check) still cost much per token (a large enum with a
long shared prefix, alternations of deep `$ref`s). The checks bound one token's work;
this bounds the request's. The clock starts at the first token of the request's first
`generate` call that carries a grammar (the prompt's processing is not grammar work; a
turn's later grammar segments share the clock) and is read after every token: past the deadline the engine's iterator is closed (the session keeps the tokens
made so far, like a client that left) and GrammarDeadlineError ends the request, a 400
`grammar_deadline_exceeded` before the response starts or the stream's terminal error
event after. The lane is then free for the next job. The engine is wrapped here, in the
server (the wrapper of `kvmem.server.prompt_progress`), so the engine stays unchanged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any

from kvmem.errors import GrammarDeadlineError

logger = logging.getLogger(__name__)


def wrap_engine(engine: Any, deadline_s: float | None) -> Any:
    """`engine` whose grammar-constrained generations end past `deadline_s` (None: never)."""
    return engine if deadline_s is None else _DeadlineEngine(engine, deadline_s)


class _DeadlineEngine:
    """The engine for one request; `generate` with a grammar is timed (one clock for all
    the request's grammar segments), everything else passes through."""

    __slots__ = ("_engine", "_deadline_s", "_started")

    def __init__(self, engine: Any, deadline_s: float) -> None:
        self._engine = engine
        self._deadline_s = deadline_s
        self._started: list[float] = []  # the first grammar token's time, once there is one

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def generate(self, prompt: Sequence[int], **kwargs: Any) -> Iterator[int]:
        tokens = self._engine.generate(prompt, **kwargs)
        if not kwargs.get("grammar"):
            return tokens
        return timed_tokens(tokens, self._deadline_s, started=self._started)


def timed_tokens(
    tokens: Iterator[int],
    deadline_s: float,
    clock: Any = time.monotonic,
    started: list[float] | None = None,
) -> Iterator[int]:
    """`tokens`, raising GrammarDeadlineError (after closing them) once `deadline_s`
    seconds have passed since the first one (or since `started[0]`, a clock shared by
    several calls)."""
    started = [] if started is None else started
    count = 0
    try:
        for token in tokens:
            now = clock()
            if not started:
                started.append(now)
            elif now - started[0] > deadline_s:
                logger.info(
                    "a grammar-constrained generation passed its deadline after %d tokens "
                    "(%g s, --grammar-deadline)",
                    count,
                    deadline_s,
                )
                raise GrammarDeadlineError(
                    f"the grammar-constrained generation ran longer than {deadline_s:g} s "
                    f"(--grammar-deadline) and was stopped after {count} tokens: simplify "
                    "the grammar or schema, or lower max_tokens"
                )
            count += 1
            yield token
    finally:
        close = getattr(tokens, "close", None)
        if close is not None:
            close()
