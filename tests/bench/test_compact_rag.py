"""compact-rag without a model: chunking, BM25 ranking and budget packing, exact.

A word tokenizer (one token per whitespace-separated word) makes every count checkable
by hand; ChatML renders each message as header + content + end marker (2 + words).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace

import pytest

from kvmem.bench.compact_prompts import (
    CompactBudget,
    chat_prompt,
    pinned_indices,
    raw_prompt,
    raw_render,
)
from kvmem.bench.compact_rag import (
    Chunk,
    cut_chunks,
    pack_chunks,
    query_spans,
    rank_chunks,
)
from kvmem.bench.conversation import ChatMLRenderer, Message, Role, ToolCall
from kvmem.memory.spans import PromptSpans, TokenSpan


class Words:
    """One token per word; ids assigned in order of first sight."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.words: list[str] = []
        self.info = SimpleNamespace(add_bos=False, bos_token_id=0)

    def tokenize(
        self, text: str, *, add_special: bool = False, parse_special: bool = True
    ) -> list[int]:
        out = []
        for word in text.split():
            if word not in self.ids:
                self.ids[word] = len(self.words)
                self.words.append(word)
            out.append(self.ids[word])
        return out

    def detokenize(self, tokens: Sequence[int]) -> str:
        return " ".join(self.words[t] for t in tokens)


def count(text: str) -> int:
    return len(text.split())


def test_chunks_split_lines_then_words_and_never_cross_messages() -> None:
    texts = ["a b c\nd e f g\nh\n", "one two three four five six seven"]
    chunks = cut_chunks(texts, count, chunk_tokens=4)
    assert chunks == [
        Chunk(0, 0, "a b c\n", 3),
        Chunk(1, 0, "d e f g\n", 4),
        Chunk(2, 0, "h\n", 1),
        Chunk(3, 1, "one two three four ", 4),
        Chunk(4, 1, "five six seven", 3),
    ]
    for source, text in enumerate(texts):
        assert "".join(c.text for c in chunks if c.source == source) == text


def test_long_lines_split_at_sentences_first() -> None:
    chunks = cut_chunks(["One two three. Four five six. Seven."], count, chunk_tokens=4)
    # sentences, merged while they fit (words would give "One two three. Four ")
    assert [(c.text, c.tokens) for c in chunks] == [
        ("One two three. ", 3),
        ("Four five six. Seven.", 4),
    ]


def test_bm25_ranks_the_needle_first_and_breaks_ties_newest_first() -> None:
    texts = ["the pass key is 123", "logs logs logs", "pass the salt", "nothing here", "more"]
    chunks = cut_chunks(texts, count)
    assert rank_chunks(chunks, "what is the pass key") == [0, 2, 4, 3, 1]
    assert rank_chunks([], "anything") == []


def test_packing_takes_the_best_that_fit_and_returns_them_in_order() -> None:
    chunks = [Chunk(0, 0, "x", 10), Chunk(1, 0, "y", 5), Chunk(2, 1, "z", 4), Chunk(3, 2, "w", 3)]

    def measure(kept: list[Chunk]) -> int:  # the estimate itself: 20 + tokens + 8 a message
        return 20 + sum(c.tokens for c in kept) + 8 * len({c.source for c in kept})

    # ranking 2, 0, 3, 1: 2 costs 12 (32), 0 costs 18 (50), 3 costs 11 (61 > 55: skipped),
    # 1 costs 5 (its message is shown: 55)
    packing = pack_chunks(chunks, [2, 0, 3, 1], 55, measure)
    assert (packing.kept, packing.prompt_tokens, packing.ranked) == ([0, 1, 2], 55, 4)


def test_packing_drops_the_lowest_ranked_while_the_real_prompt_is_over() -> None:
    chunks = [Chunk(0, 0, "x", 10), Chunk(1, 1, "y", 10), Chunk(2, 2, "z", 10)]

    def measure(kept: list[Chunk]) -> int:  # 2 tokens a message more than estimated
        return 20 + sum(c.tokens for c in kept) + 10 * len(kept)

    packing = pack_chunks(chunks, [1, 2, 0], 74, measure)  # 3 estimated at 74, real 80
    assert (packing.kept, packing.prompt_tokens) == ([1, 2], 60)
    nothing = pack_chunks(chunks, [1, 2, 0], 25, measure)
    assert (nothing.kept, nothing.prompt_tokens) == ([], 20)


def test_query_spans_are_kvmem_agent_policy() -> None:
    spans = PromptSpans(query=TokenSpan(10, 700), trajectory=TokenSpan(700, 2000))
    assert query_spans(spans, 2000, 512) == [TokenSpan(188, 700), TokenSpan(1488, 2000)]
    assert query_spans(PromptSpans(query=TokenSpan(5, 9)), 30, 512) == [TokenSpan(5, 9)]
    assert query_spans(None, 2000, 512) == [TokenSpan(1488, 2000)]  # raw: the tail


DOCUMENT = "doc line one\nthe pass key is 42\nfiller words here\nmore filler text"
MESSAGES = [
    Message(Role.SYSTEM, "sys"),
    Message(Role.USER, DOCUMENT),
    Message(Role.ASSISTANT, "ok"),
    Message(Role.USER, "what is the pass key"),
]
PREFIX = "the pass key is"


@pytest.mark.parametrize(
    ("budget", "kept", "tokens"),
    [
        # pinned: system 3 + question 7 + assistant header 1 + prefix 4 = 15; chunk 1 (the
        # needle line, 5 words) is ranked first and costs 5 + 8 estimated, 7 rendered
        (28, [1], 22),
        # then 4 ("ok": 1 + 8 > 31), 3 ("more filler text": 3, message shown) fits
        (31, [1, 3], 25),
        (20, [], 15),
    ],
)
def test_chat_prompt_keeps_the_best_chunks_of_the_history(
    budget: int, kept: list[int], tokens: int
) -> None:
    words = Words()
    renderer = ChatMLRenderer(words)
    full = renderer.render(MESSAGES, answer_prefix=PREFIX)
    limits = CompactBudget(budget=budget, query_max_tokens=512, chunk_tokens=5)
    out = chat_prompt(words, renderer, MESSAGES, full, limits, answer_prefix=PREFIX)
    assert (out.packing.kept, out.packing.prompt_tokens, len(out.prompt)) == (kept, tokens, tokens)
    assert out.packing.ranked == 5
    text = words.detokenize(out.prompt.tokens)
    assert text.startswith("<|im_start|>system sys <|im_end|>")
    assert text.endswith("what is the pass key <|im_end|> <|im_start|>assistant the pass key is")
    assert ("42" in text) == (1 in kept)


def test_pinned_messages_of_an_agent_loop() -> None:
    call = (ToolCall("c1", "run", "{}"),)
    messages = [
        Message(Role.SYSTEM, "sys"),
        Message(Role.USER, "task"),
        Message(Role.ASSISTANT, "", tool_calls=call),
        Message(Role.TOOL, "result one", tool_call_id="c1"),
        Message(Role.ASSISTANT, "", tool_calls=(ToolCall("c2", "run", "{}"),)),
        Message(Role.TOOL, "result two", tool_call_id="c2"),
    ]
    assert pinned_indices(messages) == {0, 1, 4, 5}
    assert pinned_indices(MESSAGES) == {0, 3}


def test_raw_prompt_keeps_the_question_and_the_best_document_chunks() -> None:
    words = Words()
    parts = [DOCUMENT, "\n\nQuestion: what is the pass key?\nAnswer:"]
    full = raw_render(words, parts, " The pass key is")
    assert len(full) == 14 + 7 + 4
    limits = CompactBudget(budget=24, query_max_tokens=6, chunk_tokens=5)
    out = raw_prompt(words, parts, full, limits, answer_prefix=" The pass key is")
    # the query is the prompt's last 6 words: "key? Answer: The pass key is"; pinned: 11
    assert (out.packing.kept, out.packing.prompt_tokens) == ([1], 16)
    assert words.detokenize(out.prompt.tokens) == (
        "the pass key is 42 Question: what is the pass key? Answer: The pass key is"
    )


def test_pinned_text_over_the_budget_is_shown_whole_and_warned(
    caplog: pytest.LogCaptureFixture,
) -> None:
    words = Words()
    renderer = ChatMLRenderer(words)
    full = renderer.render(MESSAGES, answer_prefix=PREFIX)
    limits = CompactBudget(budget=10, query_max_tokens=512, chunk_tokens=5)
    with caplog.at_level("WARNING", logger="kvmem.bench.compact_prompts"):
        out = chat_prompt(words, renderer, MESSAGES, full, limits, answer_prefix=PREFIX)
    assert (out.packing.kept, out.packing.prompt_tokens) == ([], 15)
    assert caplog.messages == [
        "compact-rag: the pinned text alone is 15 tokens, over the budget of 10"
    ]
