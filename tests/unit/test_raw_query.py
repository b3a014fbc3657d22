"""memory.raw_query: the last paragraph of a raw prompt's tail is its query."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kvmem.memory.raw_query import _after_last, question_start, raw_prompt_spans, raw_spans
from kvmem.memory.spans import PromptSpans, TokenSpan


def test_the_question_after_the_last_blank_line() -> None:
    pieces = [b"x = 1", b"\n", b"\n", b"Question", b":", b" what", b" is", b" x", b"?"]
    assert question_start(pieces) == 3


def test_a_blank_line_inside_one_token() -> None:
    pieces = [b"doc", b".\n\n", b"Question", b":", b" a", b"?", b"\n", b"Answer", b":"]
    assert question_start(pieces) == 2


def test_a_break_too_close_to_the_end_is_passed_over() -> None:
    # "\n\nAnswer:" leaves 2 tokens: the question starts at the blank line before it
    pieces = [b"a", b"\n\n", b"What", b" is", b" x", b"?", b"\n\n", b"Answer", b":"]
    assert question_start(pieces) == 2
    assert question_start(pieces, min_paragraph=2) == 7


def test_without_a_blank_line_the_last_lines_of_at_least_min_lines_tokens() -> None:
    question = [b"Question", b":", b" what", b" does", b" f", b" do", b"?"]  # 7 tokens
    answer = [b"\n", b"Answer", b":", b" f"]  # the last line: 3 tokens after its break
    pieces = [b"def", b" f", b"():", b"\n", b"    return", b" 1", b"\n", *question, *answer]
    assert question_start(pieces, min_lines=8) == 7  # "Question: ...\nAnswer: f"
    assert question_start(pieces, min_lines=3) == 15  # "Answer: f"
    assert question_start(pieces, min_lines=12) == 4  # from "    return"
    assert question_start(pieces, min_lines=16) is None


def test_no_break_at_all() -> None:
    assert question_start([b"one", b" long", b" line", b" of", b" text"]) is None
    assert question_start([]) is None


def test_raw_spans_place_the_question_at_its_absolute_positions() -> None:
    pieces = [b"a", b"\n\n", b"Question", b":", b" b", b"?"]  # the last 6 of 100 tokens
    assert raw_spans(100, pieces, 512) == PromptSpans(
        query=TokenSpan(96, 100), live=TokenSpan(0, 100)
    )
    assert raw_spans(1000, pieces, 512) == PromptSpans(
        query=TokenSpan(996, 1000), live=TokenSpan(488, 1000)
    )


def test_raw_spans_fall_back_to_the_tail() -> None:
    tail = TokenSpan(488, 1000)
    assert raw_spans(1000, [b"x"] * 512, 512) == PromptSpans(query=tail, live=tail)


def test_raw_prompt_spans_read_only_the_tail_through_piece() -> None:
    texts = {0: b"doc", 1: b"\n\n", 2: b"Question", 3: b":", 4: b" a", 5: b"?"}
    prompt = [0] * 10 + [1, 2, 3, 4, 5]  # 15 tokens; the question is the last 4
    read: list[int] = []

    def piece(token: int) -> bytes:
        read.append(token)
        return texts[token]

    assert raw_prompt_spans(prompt, piece, 8) == PromptSpans(
        query=TokenSpan(11, 15), live=TokenSpan(7, 15)
    )
    assert read == prompt[7:]


def _after_last_reference(pieces: list[bytes], separator: bytes, min_tokens: int) -> int | None:
    """Token by token from the end: the first token whose preceding piece holds the last
    byte of an occurrence of the separator."""
    text = b"".join(pieces)
    ends_at = {i + len(separator) for i in range(len(text)) if text.startswith(separator, i)}
    for first in range(len(pieces) - min_tokens, 0, -1):
        before = len(b"".join(pieces[: first - 1]))
        if any(before < e <= before + len(pieces[first - 1]) for e in ends_at):
            return first
    return None


@given(
    st.lists(st.sampled_from([b"a", b"\n", b"\n\n", b"b\n", b"\nc", b"", b" x"]), max_size=30),
    st.integers(min_value=0, max_value=6),
)
def test_after_last_equals_a_token_by_token_scan(pieces: list[bytes], min_tokens: int) -> None:
    for separator in (b"\n", b"\n\n"):
        want = _after_last_reference(pieces, separator, min_tokens)
        assert _after_last(pieces, separator, min_tokens) == want
