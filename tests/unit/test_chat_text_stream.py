"""Incremental UTF-8 detokenization and stop strings over streamed text."""

from __future__ import annotations

from kvmem.chat.detokenize import IncrementalDetokenizer
from kvmem.chat.stop import StopMatcher, held_prefix_length


class BytePieces:
    """A fake vocabulary: token i is the i-th byte string."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces

    def token_bytes(self, token: int) -> bytes:
        return self.pieces[token]


def test_multibyte_character_split_across_tokens_is_held_until_complete() -> None:
    euro = "€".encode()  # 3 bytes
    emoji = "😀".encode()  # 4 bytes
    vocab = BytePieces([b"a", euro[:1], euro[1:], emoji[:2], emoji[2:3], emoji[3:], b" b"])
    detok = IncrementalDetokenizer(vocab)
    deltas = [detok.push(t) for t in range(7)]
    assert deltas == ["a", "", "€", "", "", "😀", " b"]
    assert detok.flush() == ""
    assert detok.n_tokens == 7


def test_incomplete_character_at_the_end_becomes_replacement_char() -> None:
    vocab = BytePieces(["é".encode()[:1]])
    detok = IncrementalDetokenizer(vocab)
    assert detok.push(0) == ""
    assert detok.flush() == "\ufffd"


def test_held_prefix_length_is_the_longest_proper_prefix_suffix() -> None:
    assert held_prefix_length("hello <|e", ("<|end|>",)) == 3
    assert held_prefix_length("hello <", ("<|end|>", "<x")) == 1
    assert held_prefix_length("hello", ("<|end|>",)) == 0
    assert held_prefix_length("ab", ("abc", "b")) == 2


def test_stop_string_split_across_deltas_stops_and_is_not_emitted() -> None:
    matcher = StopMatcher(("STOP",))
    out = [matcher.push(t) for t in ["Hello S", "TO", "P world"]]
    assert [(r.text, r.stopped) for r in out] == [("Hello ", False), ("", False), ("", True)]
    assert matcher.stopped
    assert matcher.push("more").text == ""
    assert matcher.flush() == ""


def test_held_text_is_released_when_it_does_not_complete_a_stop() -> None:
    matcher = StopMatcher(("STOP",))
    assert matcher.push("a ST").text == "a "
    assert matcher.push("ORY").text == "STORY"
    assert matcher.push("x S").text == "x "
    assert matcher.flush() == "S"


def test_earliest_of_several_stops_wins() -> None:
    matcher = StopMatcher(("world", "lo w"))
    result = matcher.push("hello world")
    assert (result.text, result.stopped) == ("hel", True)


def test_no_stops_passes_text_through() -> None:
    matcher = StopMatcher(())
    assert matcher.push("abc").text == "abc"
    assert matcher.flush() == ""
