"""Agent-harness requests (kvmem.chat.harness) pin their control text, or get a 413.

At preparation a recognised request's rendered prompt gets its pinned parts (the system
prompt and tools, the CLAUDE.md/AGENTS.md reminders); the planner then holds their blocks
(`PromptSpans.pinned`, the pinned tier). Once tokenized on the worker, a pinned set whose
blocks, with the sink, recent and open blocks, exceed `--kvmem-budget` is refused with
`PinnedTooLargeError` (413) naming each part's tokens, before anything is processed.
`--kvmem-harness-overflow fallback` pins nothing and lets every request through.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvmem.chat.harness import harness_shape, pinned_parts
from kvmem.chat.prompt import PromptTokens, RenderedPrompt
from kvmem.config import HarnessOverflow, KVMemConfig
from kvmem.errors import PinnedTooLargeError
from kvmem.memory.planner import pinned_blocks

_ANY_LENGTH = 1 << 62  # blocks of every pinned token, complete or not


@dataclass(frozen=True, slots=True)
class PinLimit:
    """The window a harness's pinned set must fit, and whose set it is."""

    harness: str
    budget: int
    block_tokens: int
    sink_blocks: int
    recent_blocks: int

    def check(self, prompt: PromptTokens) -> None:
        """PinnedTooLargeError when the pinned blocks, the sink, the recent blocks and the
        open (partial) block the window keeps next to them exceed the budget."""
        spans = prompt.spans
        if spans is None or not spans.pinned:
            return
        bt = self.block_tokens
        blocks = set(pinned_blocks(spans.pinned, bt, _ANY_LENGTH)) | set(range(self.sink_blocks))
        needed = (len(blocks) + self.recent_blocks + 1) * bt
        if needed > self.budget:
            parts = [(n, s.length) for n, s in zip(prompt.pinned_names, spans.pinned, strict=True)]
            raise PinnedTooLargeError(self.harness, parts, needed, self.budget)


def pin_harness(
    rendered: RenderedPrompt,
    messages: list[Any],
    tools: list[dict[str, Any]],
    kv: KVMemConfig,
) -> PinLimit | None:
    """Pin a recognised harness's parts in `rendered`; the limit they must fit (None: not
    a harness, KVMem off, or --kvmem-harness-overflow fallback)."""
    if not kv.enabled or kv.harness_overflow is HarnessOverflow.FALLBACK:
        return None
    shape = harness_shape(messages, tools)
    if shape is None:
        return None
    rendered.pinned = tuple(pinned_parts(rendered.text, rendered.control_end, shape))
    return PinLimit(
        shape.harness.value, kv.budget, kv.block_tokens, kv.sink_blocks, kv.recent_blocks
    )
