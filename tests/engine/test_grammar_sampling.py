"""Grammars in the sampler on SmolLM2: a grammar that allows no more tokens (finished
with EOS banned by ignore_eos, or a token ban covering every allowed token) ends the
generation with `stop` instead of aborting the process inside llama.cpp."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings

from kvmem.chat.grammar_check import check_grammar
from kvmem.engine.engine import Engine
from kvmem.errors import InvalidRequestError
from tests.unit.test_grammar_check import GENERATED

from .helpers import GREEDY, make_engine

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine(smollm2_path: str) -> Iterator[Engine]:
    e = make_engine(smollm2_path, n_ctx=1024)
    yield e
    e.close()


def _run(engine: Engine, grammar: str, **kw: object) -> tuple[str, str]:
    prompt = engine.tokenize("Say a word:", add_special=True)
    tokens = list(
        engine.generate(prompt, sampling=GREEDY, max_tokens=20, grammar=grammar, **kw)  # type: ignore[arg-type]
    )
    return engine.detokenize(tokens), engine.last_turn.finish_reason


def test_finished_grammar_with_ignore_eos_stops(engine: Engine) -> None:
    text, finish = _run(engine, 'root ::= "yes"', ignore_eos=True)
    assert (text, finish) == ("yes", "stop")


def test_finished_grammar_without_ignore_eos_stops(engine: Engine) -> None:
    text, finish = _run(engine, 'root ::= "yes"')
    assert (text, finish) == ("yes", "stop")


def test_bans_covering_the_grammar_stop_at_once(engine: Engine) -> None:
    y_tokens = [t for t in range(engine.info.n_vocab) if engine.token_bytes(t).startswith(b"y")]
    text, finish = _run(engine, 'root ::= "yes"', banned_tokens=y_tokens)
    assert (text, finish) == ("", "stop")


def test_seeded_sampling_with_grammar_and_ban(engine: Engine) -> None:
    from kvmem.sampling import SamplingParams

    prompt = engine.tokenize("Pick:", add_special=True)
    sampling = SamplingParams(temperature=0.8, seed=7)
    runs = [
        engine.detokenize(
            list(
                engine.generate(
                    prompt,
                    sampling=sampling,
                    max_tokens=10,
                    grammar='root ::= "a" | "b" | "c"',
                    ignore_eos=True,
                )
            )
        )
        for _ in range(2)
    ]
    assert runs[0] == runs[1] and runs[0] in ("a", "b", "c")


@settings(
    max_examples=40,
    derandomize=True,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
@given(GENERATED)
def test_generated_grammars_refused_or_complete(engine: Engine, grammar: str) -> None:
    """A sample of the unit suite's generated grammars: refused by the checker, or run on
    the real model to the end (no abort, no wedge) within a generous bound."""
    try:
        check_grammar(grammar)
    except InvalidRequestError:
        return
    started = time.monotonic()
    for flags in ({}, {"ignore_eos": True}):
        _run(engine, grammar, **flags)
        assert engine.last_turn.finish_reason in ("stop", "length")
    assert time.monotonic() - started < 60
