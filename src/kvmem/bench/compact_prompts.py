"""Prompts of the `compact-rag` baseline (`compact_rag`): chat conversations and raw text.

Chat: the pinned messages are the leading system messages (with the tool definitions the
template puts there), the task (the last user message), the last message and, when that
is a tool result, the assistant call it answers; every other message is history, cut into
chunks. The kept chunks of a message replace its content (a message with tool calls is
kept whole or not at all) and the conversation is rendered again through the same
renderer, so the prompt's length is measured, not estimated.

Raw (`--layouts raw`: a completion prompt, no chat template): the prompt is the
concatenation of its parts (the document, then the question); the last part is pinned
and the others are history; the ranking query is KVMem's raw query (the question:
`kvmem.memory.raw_query`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace

from kvmem.bench.compact_rag import (
    CHUNK_TOKENS,
    Chunk,
    Packing,
    cut_chunks,
    pack_chunks,
    query_text,
    rank_chunks,
)
from kvmem.bench.conversation import (
    Message,
    PromptRenderer,
    RenderedPrompt,
    Role,
    Tools,
    text_span,
)
from kvmem.bench.engines import BenchEngine
from kvmem.memory.raw_query import raw_prompt_spans
from kvmem.memory.spans import TokenSpan

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CompactBudget:
    """KVMem's window for the prompt (`--kvmem-budget`) and its query length."""

    budget: int
    query_max_tokens: int
    chunk_tokens: int = CHUNK_TOKENS


@dataclass(slots=True)
class CompactPrompt:
    prompt: RenderedPrompt
    packing: Packing


def pinned_indices(messages: Sequence[Message]) -> set[int]:
    """The messages compact-rag always shows (see the module's docstring)."""
    pinned: set[int] = set()
    for i, m in enumerate(messages):
        if m.role is not Role.SYSTEM:
            break
        pinned.add(i)
    users = [i for i, m in enumerate(messages) if m.role is Role.USER]
    if users:
        pinned.add(users[-1])
    if messages:
        last = len(messages) - 1
        pinned.add(last)
        before = messages[last - 1] if last > 0 else None
        if messages[last].role is Role.TOOL and before is not None and before.tool_calls:
            pinned.add(last - 1)
    return pinned


def message_text(message: Message) -> str:
    """What BM25 sees of a message: its content and its tool calls' names and arguments."""
    calls = [f"{c.name} {c.arguments}" for c in message.tool_calls]
    return "\n".join(part for part in (message.content, *calls) if part)


class _Tokens:
    def __init__(self, engine: BenchEngine) -> None:
        self.engine = engine

    def count(self, text: str) -> int:
        return len(self.engine.tokenize(text, parse_special=False))


def chat_prompt(
    engine: BenchEngine,
    renderer: PromptRenderer,
    messages: Sequence[Message],
    full: RenderedPrompt,
    limits: CompactBudget,
    *,
    tools: Tools | None = None,
    answer_prefix: str = "",
) -> CompactPrompt:
    """The compacted conversation of `messages` (rendered in full as `full`)."""
    pinned = pinned_indices(messages)
    history = [i for i in range(len(messages)) if i not in pinned]
    chunks = cut_chunks(
        [message_text(messages[i]) for i in history], _Tokens(engine).count, limits.chunk_tokens
    )
    query = query_text(full.tokens, full.spans, limits.query_max_tokens, engine.detokenize)

    def rebuild(kept: list[Chunk]) -> list[Message]:
        by_source: dict[int, list[str]] = {}
        for chunk in kept:
            by_source.setdefault(history[chunk.source], []).append(chunk.text)
        out = []
        for i, m in enumerate(messages):
            if i in pinned or (i in by_source and m.tool_calls):
                out.append(m)
            elif i in by_source:
                out.append(replace(m, content="".join(by_source[i])))
        return out

    def render(kept: list[Chunk]) -> RenderedPrompt:
        return renderer.render(rebuild(kept), answer_prefix=answer_prefix, tools=tools)

    packing = pack_chunks(
        chunks, rank_chunks(chunks, query), limits.budget, lambda kept: len(render(kept))
    )
    _warn_over(packing, limits)
    return CompactPrompt(render([chunks[i] for i in packing.kept]), packing)


def _warn_over(packing: Packing, limits: CompactBudget) -> None:
    if packing.prompt_tokens > limits.budget:
        logger.warning(
            "compact-rag: the pinned text alone is %d tokens, over the budget of %d",
            packing.prompt_tokens,
            limits.budget,
        )


def raw_render(
    engine: BenchEngine, parts: Sequence[str], answer_prefix: str = ""
) -> RenderedPrompt:
    """A raw completion prompt: BOS (if the model adds one), then the parts' text as plain
    text; no chat spans (KVMem's query is the prompt's question: `Engine._spans`)."""
    info = engine.info
    head = [info.bos_token_id] if info.add_bos else []
    text = "".join(parts) + answer_prefix
    return RenderedPrompt(
        tokens=head + engine.tokenize(text, parse_special=False), query=None, text=text
    )


def raw_span_of(engine: BenchEngine, prompt: RenderedPrompt, text: str) -> TokenSpan | None:
    """The tokens of the raw prompt `prompt` (a `raw_render`) that hold the last occurrence
    of `text`, or None: the oracle's needle span in a completion prompt."""
    at = prompt.text.rfind(text)
    if at < 0:
        return None
    head = 1 if engine.info.add_bos else 0  # raw_render's BOS

    def tokenize(part: str) -> list[int]:
        return engine.tokenize(part, parse_special=False)

    return text_span(tokenize, prompt.text, at, len(text), prompt.tokens[head:], head)


def raw_prompt(
    engine: BenchEngine,
    parts: Sequence[str],
    full: RenderedPrompt,
    limits: CompactBudget,
    *,
    answer_prefix: str = "",
) -> CompactPrompt:
    """The compacted raw prompt: chunks of every part but the last, then the last part."""
    history, tail = list(parts[:-1]), parts[-1] if parts else ""
    chunks = cut_chunks(history, _Tokens(engine).count, limits.chunk_tokens)
    q = limits.query_max_tokens
    spans = raw_prompt_spans(full.tokens, lambda t: engine.detokenize([t]).encode(), q)
    query = query_text(full.tokens, spans, q, engine.detokenize)

    def render(kept: list[Chunk]) -> RenderedPrompt:
        return raw_render(engine, [*(c.text for c in kept), tail], answer_prefix)

    packing = pack_chunks(
        chunks, rank_chunks(chunks, query), limits.budget, lambda kept: len(render(kept))
    )
    _warn_over(packing, limits)
    return CompactPrompt(render([chunks[i] for i in packing.kept]), packing)
