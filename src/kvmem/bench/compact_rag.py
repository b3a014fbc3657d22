"""The `compact-rag` text baseline: compaction plus retrieval of text, in KVMem's budget.

The history is cut into chunks of text at message boundaries (a long message is split at
lines, then sentences, then words, into chunks of at most `chunk_tokens`), the chunks are
ranked by BM25 (`rank_bm25.BM25Okapi`) against the text of the same query KVMem scores
with (`query_text`: the task and the trajectory's tail, or a raw prompt's question), and the
best chunks are prefilled again, in their original order, with the pinned text (control
text, task and the last message) so that the whole prompt fits KVMem's window budget.
A full-context engine answers the compacted prompt. `chat_prompt` and `raw_prompt` (in
`compact_prompts`) build it for chat conversations and raw completion prompts.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rank_bm25 import BM25Okapi

from kvmem.memory.spans import PromptSpans, TokenSpan

CHUNK_TOKENS = 128  # the largest chunk (a long message is split into pieces of this size)
MESSAGE_MARKUP = 8  # tokens a re-rendered message adds around its chunks (an estimate)

_LINES = re.compile(r"[^\n]*\n|[^\n]+")
_SENTENCES = re.compile(r".*?[.!?](?:\s+|$)|.+", re.DOTALL)
_WORDS = re.compile(r"\s*\S+\s*|\s+")
_TERMS = re.compile(r"\w+")


@dataclass(frozen=True, slots=True)
class Chunk:
    """A piece of one message's text; the chunks of a message concatenate to its text."""

    id: int  # position in the history, in order
    source: int  # the index of its message (or text) among those cut
    text: str
    tokens: int


@dataclass(slots=True)
class Packing:
    """The chunks kept (ids, in order), and how many tokens the final prompt has."""

    kept: list[int]
    prompt_tokens: int
    ranked: int  # chunks there were to choose from


def _split(text: str, pattern: re.Pattern[str]) -> list[str]:
    return [p for p in pattern.findall(text) if p]


def _pieces(text: str, count: Callable[[str], int], limit: int) -> list[tuple[str, int]]:
    """`text` as consecutive pieces of at most `limit` tokens where it can be (lines, then
    sentences, then words), each with its token count."""
    out: list[tuple[str, int]] = []
    for line in _split(text, _LINES):
        n = count(line)
        if n <= limit:
            out.append((line, n))
            continue
        for sentence in _split(line, _SENTENCES):
            m = count(sentence)
            if m <= limit:
                out.append((sentence, m))
            else:
                out += [(word, count(word)) for word in _split(sentence, _WORDS)]
    return out


def cut_chunks(
    texts: Sequence[str], count: Callable[[str], int], chunk_tokens: int = CHUNK_TOKENS
) -> list[Chunk]:
    """Each text cut into chunks of at most `chunk_tokens` (a single longer word is a
    chunk of its own); no chunk crosses from one text to the next."""
    chunks: list[Chunk] = []
    for source, text in enumerate(texts):
        parts: list[str] = []
        used = 0
        for piece, n in _pieces(text, count, chunk_tokens):
            if parts and used + n > chunk_tokens:
                chunks.append(_chunk(len(chunks), source, parts, count))
                parts, used = [], 0
            parts.append(piece)
            used += n
        if parts:
            chunks.append(_chunk(len(chunks), source, parts, count))
    return chunks


def _chunk(index: int, source: int, parts: list[str], count: Callable[[str], int]) -> Chunk:
    text = "".join(parts)
    return Chunk(id=index, source=source, text=text, tokens=count(text))


def terms(text: str) -> list[str]:
    """BM25's terms: lowercase words."""
    return [t.lower() for t in _TERMS.findall(text)]


def rank_chunks(chunks: Sequence[Chunk], query: str) -> list[int]:
    """Chunk ids, best BM25 score first (ties: the later chunk first, as the newer)."""
    if not chunks:
        return []
    scores = BM25Okapi([terms(c.text) or [""] for c in chunks]).get_scores(terms(query))
    return sorted((c.id for c in chunks), key=lambda i: (-float(scores[i]), -i))


def pack_chunks(
    chunks: Sequence[Chunk],
    ranking: Sequence[int],
    budget: int,
    measure: Callable[[list[Chunk]], int],
) -> Packing:
    """The best chunks whose prompt fits `budget` tokens: taken in `ranking` order by their
    estimated cost (a chunk's tokens, plus `MESSAGE_MARKUP` for a message not yet shown),
    then `measure(kept chunks in order)` (the real prompt's length) checked, dropping the
    lowest-ranked kept chunk while it is over."""
    base = measure([])
    used = base
    chosen: list[int] = []
    shown: set[int] = set()
    for i in ranking:
        chunk = chunks[i]
        cost = chunk.tokens + (0 if chunk.source in shown else MESSAGE_MARKUP)
        if used + cost > budget:
            continue
        chosen.append(i)
        shown.add(chunk.source)
        used += cost
    n = measure(_in_order(chunks, chosen)) if chosen else base
    while chosen and n > budget:
        chosen.pop()
        n = measure(_in_order(chunks, chosen)) if chosen else base
    return Packing(kept=sorted(chosen), prompt_tokens=n, ranked=len(chunks))


def _in_order(chunks: Sequence[Chunk], ids: Sequence[int]) -> list[Chunk]:
    return [chunks[i] for i in sorted(ids)]


def query_spans(spans: PromptSpans | None, n_tokens: int, max_tokens: int) -> list[TokenSpan]:
    """The token spans KVMem's query holds under the default `agent` policy
    (`KVMemSession._resolve_spans`, `_capture_spans`): the task's and the trajectory's last
    `max_tokens` tokens, or, with no spans at all, the prompt's own tail (a raw prompt's
    spans come from `kvmem.memory.raw_query.raw_prompt_spans`, as the engine's do)."""
    if spans is None or spans.query is None:
        return [TokenSpan(max(0, n_tokens - max_tokens), n_tokens)]
    out = [spans.query.last(max_tokens)]
    if spans.trajectory is not None:
        tail = spans.trajectory.last(max_tokens)
        if tail.length and tail != out[0]:
            out.append(tail)
    return out


def query_text(
    tokens: Sequence[int],
    spans: PromptSpans | None,
    max_tokens: int,
    detokenize: Callable[[Sequence[int]], str],
) -> str:
    """The text of KVMem's query in `tokens` (see `query_spans`)."""
    parts = query_spans(spans, len(tokens), max_tokens)
    return "\n".join(detokenize(tokens[s.start : s.end]) for s in parts)
