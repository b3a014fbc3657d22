"""`--grammar-deadline`'s token wrapper with a fake clock: the clock starts at the first
token, the iterator is closed and GrammarDeadlineError raised once the deadline passed;
generations without a grammar are not wrapped."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from kvmem.cli.server_config import load_server_settings
from kvmem.errors import ConfigError, GrammarDeadlineError, InvalidRequestError
from kvmem.server.error_map import classify
from kvmem.server.grammar_deadline import timed_tokens, wrap_engine


class _Clock:
    def __init__(self, times: list[float]) -> None:
        self.times = times

    def __call__(self) -> float:
        return self.times.pop(0)


class _Tokens:
    def __init__(self, n: int) -> None:
        self.closed = False
        self.it: Iterator[int] = iter(range(n))

    def __iter__(self) -> _Tokens:
        return self

    def __next__(self) -> int:
        return next(self.it)

    def close(self) -> None:
        self.closed = True


def test_tokens_within_the_deadline_pass_unchanged() -> None:
    tokens = _Tokens(3)
    assert list(timed_tokens(tokens, 5.0, _Clock([100.0, 102.0, 105.0]))) == [0, 1, 2]
    assert tokens.closed


def test_past_the_deadline_the_tokens_are_closed_and_the_error_names_the_flag() -> None:
    tokens = _Tokens(10)
    out: list[int] = []
    with pytest.raises(GrammarDeadlineError, match=r"longer than 5 s \(--grammar-deadline\)"):
        for token in timed_tokens(tokens, 5.0, _Clock([0.0, 1.0, 4.0, 5.5])):
            out.append(token)
    assert out == [0, 1, 2]
    assert tokens.closed
    error = classify(GrammarDeadlineError("x"))
    assert (error.status, error.type, error.code) == (
        400,
        "invalid_request_error",
        "grammar_deadline_exceeded",
    )
    assert issubclass(GrammarDeadlineError, InvalidRequestError)


class _Engine:
    name = "fake"

    def generate(self, prompt: list[int], **kwargs: Any) -> Iterator[int]:
        return iter(prompt)


def test_only_grammar_generations_are_timed() -> None:
    engine = _Engine()
    assert wrap_engine(engine, None) is engine
    wrapped = wrap_engine(engine, 1.0)
    assert wrapped.name == "fake"
    plain = wrapped.generate([1, 2])
    assert type(plain).__name__ == "list_iterator"
    timed = wrapped.generate([1, 2], grammar='root ::= "a"')
    assert type(timed).__name__ == "generator"
    assert list(timed) == [1, 2]


def test_the_flags_reach_the_settings() -> None:
    limits = load_server_settings([], {})[0].limits
    assert (limits.grammar_deadline_s, limits.max_connections_per_client) == (60.0, None)
    limits = load_server_settings(
        ["--grammar-deadline", "0", "--max-connections-per-client", "8"], {}
    )[0].limits
    assert (limits.grammar_deadline_s, limits.max_connections_per_client) == (None, 8)
    assert (
        load_server_settings(["--grammar-deadline", "2.5"], {})[0].limits.grammar_deadline_s == 2.5
    )
    for bad in (["--grammar-deadline", "-1"], ["--max-connections-per-client", "0"]):
        with pytest.raises(ConfigError):
            load_server_settings(bad, {})


def test_a_requests_grammar_segments_share_one_clock() -> None:
    shared: list[float] = []
    assert list(timed_tokens(_Tokens(2), 5.0, _Clock([10.0, 12.0]), shared)) == [0, 1]
    assert shared == [10.0]
    with pytest.raises(GrammarDeadlineError):
        list(timed_tokens(_Tokens(2), 5.0, _Clock([14.0, 15.5]), shared))
