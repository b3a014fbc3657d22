"""Request bodies in the shapes of Claude Code, OpenCode and Codex CLI, made here (their
system-prompt openings, tool names and reminder frames; the texts are short stand-ins)."""

from __future__ import annotations

from typing import Any


def tool(name: str) -> dict[str, Any]:
    schema = {"type": "object", "properties": {"arg": {"type": "string"}}}
    return {
        "type": "function",
        "function": {"name": name, "description": name, "parameters": schema},
    }


def claude_md(rule: str) -> str:
    return (
        "<system-reminder>\nAs you answer the user's questions, you can use the following "
        "context:\n# claudeMd\nContents of /repo/CLAUDE.md (project instructions, checked into "
        f"the codebase):\n\n{rule}\n</system-reminder>"
    )


def agents_md_opencode(rule: str) -> str:
    return f"<system-reminder>\nInstructions from: /repo/AGENTS.md\n{rule}\n</system-reminder>"


def agents_md_codex(rule: str) -> str:
    return f"# AGENTS.md instructions for /repo\n\n<INSTRUCTIONS>\n{rule}\n</INSTRUCTIONS>"


CLAUDE_SYSTEM = "You are Claude Code, Anthropic's official CLI for Claude. Be concise."
OPENCODE_SYSTEM = "You are opencode, an interactive CLI tool that helps users with software."
CODEX_SYSTEM = "You are Codex, a coding agent running in the Codex CLI on a user's computer."
CLAUDE_TOOLS = [tool(n) for n in ("Bash", "Read", "Edit", "Write", "Glob", "Grep", "TodoWrite")]
OPENCODE_TOOLS = [tool(n) for n in ("bash", "read", "edit", "write", "glob", "grep", "todowrite")]
CODEX_TOOLS = [tool(n) for n in ("shell", "apply_patch", "update_plan")]


def claude_code(rule: str, task: str) -> dict[str, Any]:
    user = {"role": "user", "content": [{"type": "text", "text": claude_md(rule)},
                                        {"type": "text", "text": task}]}  # fmt: skip
    return {"messages": [{"role": "system", "content": CLAUDE_SYSTEM}, user], "tools": CLAUDE_TOOLS}


def opencode(rule: str, task: str) -> dict[str, Any]:
    user = {"role": "user", "content": f"{task}\n\n{agents_md_opencode(rule)}"}
    return {
        "messages": [{"role": "system", "content": OPENCODE_SYSTEM}, user],
        "tools": OPENCODE_TOOLS,
    }


def codex(rule: str, task: str) -> dict[str, Any]:
    messages = [
        {"role": "system", "content": CODEX_SYSTEM},
        {"role": "user", "content": agents_md_codex(rule)},
        {"role": "user", "content": task},
    ]
    return {"messages": messages, "tools": CODEX_TOOLS}
