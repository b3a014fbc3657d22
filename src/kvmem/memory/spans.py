"""Token ranges of a prompt that the window treats specially (pure data).

`TokenSpan` is a half-open range of prompt positions. `PromptSpans` says where a chat
prompt's parts are: the control text (system prompt and tool definitions), the task
(the last user message), the live trajectory after it (assistant tool calls and tool
results) and the last message, whose tail is replayed after a reselection. A raw
completion prompt has none of them; its query is its own tail. `groups` are the token
ranges of images: the window holds the blocks of each one all together or not at all.
`pinned` are the ranges an agent harness needs held (its control text and reminders).
`unlocated` names the spans a chat prompt has but whose text was not found.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TokenSpan:
    """A half-open token range [start, end) of a prompt."""

    start: int
    end: int

    def __post_init__(self) -> None:
        if not 0 <= self.start <= self.end:
            raise ValueError(f"invalid token span [{self.start}, {self.end})")

    @property
    def length(self) -> int:
        return self.end - self.start

    def last(self, n_tokens: int) -> TokenSpan:
        """The last `n_tokens` tokens of the span (all of it when shorter)."""
        return TokenSpan(max(self.start, self.end - n_tokens), self.end)

    def clip(self, end: int) -> TokenSpan | None:
        """The part before `end`, None when nothing is left."""
        clipped = TokenSpan(min(self.start, end), min(self.end, end))
        return clipped if clipped.length else None

    def blocks(self, block_tokens: int) -> range:
        """Ids of the blocks holding at least one token of the span."""
        if not self.length:
            return range(0)
        return range(self.start // block_tokens, (self.end - 1) // block_tokens + 1)


@dataclass(frozen=True, slots=True)
class PromptSpans:
    """Where a prompt's parts lie; each may be absent (None)."""

    control: TokenSpan | None = None  # system prompt and tool definitions
    query: TokenSpan | None = None  # the task: the last role=user message's text
    trajectory: TokenSpan | None = None  # after the last user message, to the prompt's end
    live: TokenSpan | None = None  # the last message, to the prompt's end
    groups: tuple[TokenSpan, ...] = ()  # image rows, ascending: each selected whole
    # control text an agent harness needs on the GPU (its system prompt and tools, its
    # CLAUDE.md/AGENTS.md reminders: kvmem.chat.harness); the planner's pinned tier
    pinned: tuple[TokenSpan, ...] = ()
    # spans the prompt has but the chat layer could not find in its rendering (by name:
    # "query", "control", "trajectory", "live"); the engine's trace says so
    unlocated: tuple[str, ...] = ()

    def clipped(self, end: int) -> PromptSpans:
        """The spans cut at position `end` (a prompt of `end` tokens)."""
        return PromptSpans(
            *(
                None if s is None else s.clip(end)
                for s in (self.control, self.query, self.trajectory, self.live)
            ),
            groups=tuple(c for g in self.groups if (c := g.clip(end)) is not None),
            pinned=tuple(c for p in self.pinned if (c := p.clip(end)) is not None),
            unlocated=self.unlocated,
        )

    @classmethod
    def of(cls, value: PromptSpans | TokenSpan | None) -> PromptSpans:
        """Spans from what callers pass: spans, a bare query span, or nothing."""
        if isinstance(value, PromptSpans):
            return value
        return cls(query=value, live=value)
