"""The question of a raw completion prompt: its last paragraph (pure).

A raw prompt has no user message, so nothing marks the task. What a person writes after a
document is its last paragraph ("Question: ...\\nAnswer:", an instruction, the line being
completed). Scoring with the whole tail instead (the prompt's last
`--kvmem-query-max-tokens` tokens, mostly document text) ranks the document's own
neighbourhood, not what the question asks for. The tail stays the live span (pinned); the
last paragraph is the query.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Sequence
from itertools import accumulate

from .spans import PromptSpans, TokenSpan

MIN_PARAGRAPH_TOKENS = 4  # a blank line closer to the end does not start the question
MIN_LINES_TOKENS = 16  # without a blank line: the last lines holding at least this many


def question_start(
    pieces: Sequence[bytes],
    min_paragraph: int = MIN_PARAGRAPH_TOKENS,
    min_lines: int = MIN_LINES_TOKENS,
) -> int | None:
    """The index into `pieces` (the tail's token texts, in order) where the question
    starts: after the last blank line that leaves at least `min_paragraph` tokens, else at
    the start of the last lines that hold at least `min_lines` tokens ("Question: ...",
    then "Answer:"); None when the tail has neither."""
    start = _after_last(pieces, b"\n\n", min_paragraph)
    return start if start is not None else _after_last(pieces, b"\n", min_lines)


def _after_last(pieces: Sequence[bytes], separator: bytes, min_tokens: int) -> int | None:
    """The first token after the last `separator` (which may span two tokens) that leaves
    at least `min_tokens` tokens before the end; None if there is none."""
    ends = list(accumulate(len(p) for p in pieces))  # byte offset where each piece ends
    text = b"".join(pieces)
    cut = len(pieces) - min_tokens  # the question's first token is at most here
    found = text.rfind(separator)
    while found >= 0:
        done = found + len(separator)  # the separator's last byte ends before `done`
        token = bisect_left(ends, done)  # the piece holding the separator's last byte
        if token + 1 <= cut:
            return token + 1
        found = text.rfind(separator, 0, found + len(separator) - 1)  # overlaps too
    return None


def raw_spans(n: int, tail_pieces: Sequence[bytes], tail_tokens: int) -> PromptSpans:
    """The spans of a raw prompt of `n` tokens whose last `len(tail_pieces)` token texts
    are given: the query is the last paragraph within them, the live span the last
    `tail_tokens` tokens; both the tail when no paragraph is found."""
    tail = TokenSpan(max(0, n - tail_tokens), n)
    start = question_start(tail_pieces)
    if start is None:
        return PromptSpans(query=tail, live=tail)
    return PromptSpans(query=TokenSpan(n - len(tail_pieces) + start, n), live=tail)


def raw_prompt_spans(
    prompt: Sequence[int], piece: Callable[[int], bytes], tail_tokens: int
) -> PromptSpans:
    """`raw_spans` of the token ids `prompt`, each of its last `tail_tokens` ids turned into
    its text by `piece` (the engine's query; the bench's text baseline ranks with the same)."""
    pieces = [piece(t) for t in prompt[-tail_tokens:]] if tail_tokens > 0 else []
    return raw_spans(len(prompt), pieces, tail_tokens)
