"""Agent harnesses recognised by their request shape, and the control text they need pinned.

Claude Code, OpenCode and Codex CLI send long system prompts, fixed tool sets and, inside
user messages, the project's instruction files (CLAUDE.md, AGENTS.md) as reminder blocks.
A request is recognised (docs/server.md, "Agent harnesses") by a marker of its system
prompt or by most of its tool set:

- Claude Code: "You are Claude Code" in a system message, or at least four of Bash, Read,
  Edit, Write, Glob, Grep, TodoWrite; reminders are `<system-reminder>` blocks naming
  CLAUDE.md;
- OpenCode: "You are opencode" in a system message, or at least four of bash, read, edit,
  write, glob, grep, list, todowrite; reminders are `<system-reminder>` blocks naming
  AGENTS.md or "Instructions from:";
- Codex CLI: "You are Codex" or "Codex CLI" in a system message, or the shell tool with
  apply_patch or update_plan; reminders are "# AGENTS.md instructions for" blocks (up to
  `</INSTRUCTIONS>`) and `<user_instructions>` blocks.

Each distinct reminder block is pinned once, at its latest occurrence; the system prompt
and tool definitions (the control text) are pinned too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from kvmem.chat.message_spans import CharSpan


class Harness(Enum):
    CLAUDE_CODE = "claude-code"
    OPENCODE = "opencode"
    CODEX = "codex"


@dataclass(frozen=True, slots=True)
class _Shape:
    markers: tuple[str, ...]  # in a system message
    tools: frozenset[str]  # its usual tool set
    min_tools: int  # how many of them recognise it
    reminders: tuple[re.Pattern[str], ...]  # its reminder blocks in user messages


_REMINDER = r"<system-reminder>(?:(?!</system-reminder>).)*?{name}.*?</system-reminder>"
SHAPES: dict[Harness, _Shape] = {
    Harness.CLAUDE_CODE: _Shape(
        ("You are Claude Code",),
        frozenset({"Bash", "Read", "Edit", "Write", "Glob", "Grep", "TodoWrite"}),
        4,
        (re.compile(_REMINDER.format(name=r"CLAUDE\.md"), re.S),),
    ),
    Harness.OPENCODE: _Shape(
        ("You are opencode",),
        frozenset({"bash", "read", "edit", "write", "glob", "grep", "list", "todowrite"}),
        4,
        (re.compile(_REMINDER.format(name=r"(?:AGENTS\.md|Instructions from:)"), re.S),),
    ),
    Harness.CODEX: _Shape(
        ("You are Codex", "Codex CLI"),
        frozenset({"shell", "apply_patch", "update_plan"}),
        2,
        (
            re.compile(r"# AGENTS\.md instructions for .*?</INSTRUCTIONS>", re.S),
            re.compile(r"<user_instructions>.*?</user_instructions>", re.S),
        ),
    ),
}


@dataclass(frozen=True, slots=True)
class Reminder:
    """A project-instruction block of a user message, pinned as control text."""

    name: str  # what a 413 calls it: "CLAUDE.md reminder", "AGENTS.md reminder"
    text: str


@dataclass(frozen=True, slots=True)
class HarnessShape:
    harness: Harness
    reminders: tuple[Reminder, ...]  # distinct blocks, in order of their latest occurrence


def _texts(content: Any) -> Iterable[str]:
    if isinstance(content, str):
        yield content
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                yield part["text"]


def _tool_names(tools: list[dict[str, Any]]) -> set[str]:
    return {str((t.get("function") or {}).get("name", "")) for t in tools}


def recognise(messages: list[Any], tools: list[dict[str, Any]]) -> Harness | None:
    """The harness a chat request (messages, tool dicts) comes from, None for any other."""
    system = " ".join(
        text
        for m in messages
        if isinstance(m, dict) and m.get("role") in ("system", "developer")
        for text in _texts(m.get("content"))
    )
    names = _tool_names(tools)
    for harness, shape in SHAPES.items():
        if any(marker in system for marker in shape.markers):
            return harness
    for harness, shape in SHAPES.items():
        if len(names & shape.tools) >= shape.min_tools and _codex_shell(harness, names):
            return harness
    return None


def _codex_shell(harness: Harness, names: set[str]) -> bool:
    return harness is not Harness.CODEX or "shell" in names


def harness_shape(messages: list[Any], tools: list[dict[str, Any]]) -> HarnessShape | None:
    """The recognised harness and its reminder blocks (None: not a known harness)."""
    harness = recognise(messages, tools)
    if harness is None:
        return None
    latest: dict[str, Reminder] = {}
    for m in messages:
        if not isinstance(m, dict) or m.get("role") != "user":
            continue
        for text in _texts(m.get("content")):
            for pattern in SHAPES[harness].reminders:
                for found in pattern.finditer(text):
                    block = found.group(0)
                    latest.pop(block, None)  # re-inserted: ordered by latest occurrence
                    latest[block] = Reminder(_reminder_name(block), block)
    return HarnessShape(harness, tuple(latest.values()))


def _reminder_name(block: str) -> str:
    return "CLAUDE.md reminder" if "CLAUDE.md" in block else "AGENTS.md reminder"


@dataclass(frozen=True, slots=True)
class PinnedText:
    """A pinned part of the rendered prompt: what it is, and its characters."""

    name: str  # "system prompt and tools", "CLAUDE.md reminder", ...
    chars: CharSpan


def pinned_parts(text: str, control_end: int | None, shape: HarnessShape) -> list[PinnedText]:
    """Where the harness's control text and reminders lie in the rendered `text` (a
    reminder the template changed past finding is left out)."""
    parts = [PinnedText("system prompt and tools", CharSpan(0, control_end))] if control_end else []
    for reminder in shape.reminders:
        at = text.rfind(reminder.text)
        if at >= 0:
            parts.append(PinnedText(reminder.name, CharSpan(at, at + len(reminder.text))))
    return parts
