"""Splitting a model's thinking (`<think>...</think>`) from its answer, while streaming.

The generation prompt of a thinking template may already open the thinking block (Qwen3.5
style `<|im_start|>assistant\\n<think>\\n`); then the output starts inside it. Otherwise
a thinking block is recognised only at the start of the output.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from kvmem.chat.stop import held_prefix_length


@dataclass(frozen=True, slots=True)
class ReasoningMarkers:
    """The open/close tags of a thinking block."""

    open: str = "<think>"
    close: str = "</think>"


THINK_TAGS = ReasoningMarkers("<think>", "</think>")
MISTRAL_THINK_TAGS = ReasoningMarkers("[THINK]", "[/THINK]")


def markers_for_template(source: str) -> ReasoningMarkers | None:
    """The thinking tags a template uses, or None for a template without thinking."""
    if "[THINK]" in source:
        return MISTRAL_THINK_TAGS
    if "<think>" in source or "</think>" in source:
        return THINK_TAGS
    return None


def prompt_opens_reasoning(prompt: str, markers: ReasoningMarkers | None) -> bool:
    """True when the rendered prompt ends inside an unclosed thinking block."""
    if markers is None:
        return False
    opened = prompt.rfind(markers.open)
    return opened != -1 and prompt.rfind(markers.close) < opened


class Channel(Enum):
    """Where a piece of output text belongs."""

    REASONING = "reasoning_content"
    CONTENT = "content"


@dataclass(slots=True)
class Piece:
    channel: Channel
    text: str


class _State(Enum):
    START = "start"  # nothing but whitespace seen yet; a thinking block may still open
    REASONING = "reasoning"
    CONTENT = "content"


class ReasoningSplitter:
    """Routes streamed output text to reasoning or content."""

    __slots__ = ("_markers", "_state", "_held", "_trim")

    def __init__(self, markers: ReasoningMarkers | None, *, starts_in_reasoning: bool) -> None:
        self._markers = markers
        if markers is None:
            self._state = _State.CONTENT
        else:
            self._state = _State.REASONING if starts_in_reasoning else _State.START
        self._held = ""
        self._trim = starts_in_reasoning  # drop newlines right after a tag

    @property
    def in_reasoning(self) -> bool:
        return self._state is _State.REASONING

    @property
    def markers(self) -> ReasoningMarkers | None:
        return self._markers

    def push(self, text: str) -> list[Piece]:
        pieces: list[Piece] = []
        buffer = self._held + text
        self._held = ""
        while buffer:
            if self._trim:
                buffer = buffer.lstrip("\n")
                if not buffer:
                    break
                self._trim = False
            if self._state is _State.CONTENT:
                pieces.append(Piece(Channel.CONTENT, buffer))
                break
            assert self._markers is not None
            if self._state is _State.START:
                stripped = buffer.lstrip()
                if not stripped:
                    self._held = buffer
                    break
                if stripped.startswith(self._markers.open):
                    self._state = _State.REASONING
                    buffer = stripped[len(self._markers.open) :]
                    self._trim = True
                    continue
                if self._markers.open.startswith(stripped):
                    self._held = buffer
                    break
                self._state = _State.CONTENT
                continue
            # REASONING
            at = buffer.find(self._markers.close)
            if at != -1:
                if at:
                    pieces.append(Piece(Channel.REASONING, buffer[:at]))
                self._state = _State.CONTENT
                buffer = buffer[at + len(self._markers.close) :]
                self._trim = True
                continue
            keep = held_prefix_length(buffer, (self._markers.close,))
            emit = buffer[: len(buffer) - keep]
            self._held = buffer[len(buffer) - keep :]
            if emit:
                pieces.append(Piece(Channel.REASONING, emit))
            break
        return _merge(pieces)

    def flush(self) -> list[Piece]:
        held, self._held = self._held, ""
        if not held:
            return []
        channel = Channel.REASONING if self._state is _State.REASONING else Channel.CONTENT
        if self._state is _State.START and not held.strip():
            return []
        return [Piece(channel, held)]


def _merge(pieces: list[Piece]) -> list[Piece]:
    merged: list[Piece] = []
    for piece in pieces:
        if not piece.text:
            continue
        if merged and merged[-1].channel is piece.channel:
            merged[-1].text += piece.text
        else:
            merged.append(piece)
    return merged
