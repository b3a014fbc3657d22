"""The agent-loop needle layout: the question arrives as a tool result, not a user turn.

This is the loop an agent actually runs. The system prompt and the tool definitions come
first, then the one user message: the task, at the very start. Everything after it is
assistant tool calls (OpenAI `tool_calls`) and their `tool` results (logs, JSON, source
files), and the needle is one line of one result. The last round is the agent resuming
the deploy, whose result says the vault is locked and asks for the pass key from the
earlier results. The reply starts with the call the agent must make, up to the key:

    <tool_call>
    {"name": "unlock_vault", "arguments": {"vault": "deploy", "pass_key": "

and is correct when the key's digits follow. The retrieval query under
`--kvmem-query-policy user` is therefore the task, which never names the key's place.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvmem.bench.conversation import Message, Role, ToolCall
from kvmem.bench.haystack import tool_rounds

SYSTEM_PROMPT = (
    "You are a coding agent working in a software repository. Use the tools to complete "
    "the user's task, one tool call at a time."
)
_TASK = (
    "The nightly deploy failed. Use the tools to look through the logs, the database and "
    "the code to find out why, then finish the deploy. {keys} you will need it to unlock "
    "the vault at the end."
)
_ONE_KEY = "One of the tool results contains the pass key of the deploy vault:"
_MANY_KEYS = "The tool results contain the pass keys of several vaults; keep them, because"
_RESUME = "./deploy.sh --resume"
_LOCKED = (
    "deploy.sh: resuming at step 4/4 (unlock)\n"
    "error: the {vault} vault is locked\n"
    "hint: call unlock_vault with the pass key {which}from the earlier tool results"
)
# Markup per round (Qwen's template): the assistant header, <tool_call>\n ... \n</tool_call>,
# the tool result's <|im_start|>user\n<tool_response>\n ... \n</tool_response><|im_end|>.
_ROUND_MARKUP = 20
_TOOLS_MARKUP = 60  # the template's text around the tool definitions
# Counting each line of a result on its own overestimates the joined result by ~1% (Qwen
# measured at 8K-28K); the haystack budget is scaled up by this much to land on `length`.
_LINE_COUNT_BIAS = 1.01


def tool_definition(name: str, description: str, **params: str) -> dict[str, Any]:
    """An OpenAI function tool whose parameters are all required strings."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {k: {"type": "string", "description": v} for k, v in params.items()},
                "required": list(params),
            },
        },
    }


TOOLS: list[dict[str, Any]] = [
    tool_definition(
        "run_command", "Run a shell command in the repository.", command="the command line"
    ),
    tool_definition(
        "query_db", "Run a read-only SQL query on the orders database.", sql="the query"
    ),
    tool_definition("read_file", "Read a file of the repository.", path="the file's path"),
    tool_definition(
        "unlock_vault",
        "Unlock a deploy vault with its pass key.",
        vault="the vault's name",
        pass_key="the vault's pass key",
    ),
]


@dataclass(slots=True)
class AgentLoop:
    messages: list[Message]
    tools: list[dict[str, Any]]
    answer_prefix: str


def call_text(name: str, arguments: dict[str, str]) -> str:
    """A tool call as Qwen's template renders it (Hermes JSON in <tool_call> tags)."""
    body = json.dumps({"name": name, "arguments": arguments})
    return f"<tool_call>\n{body}\n</tool_call>"


def agent_loop_case(
    length: int,
    rng: random.Random,
    needles: list[tuple[float, str]],
    target_vault: str | None,
    count_tokens: Callable[[str], int],
) -> AgentLoop:
    """The agent-loop conversation of about `length` tokens with `needles` at their depths
    (among the lines of the tool results before the last round)."""
    vault = target_vault or "deploy"
    task = _TASK.format(keys=_ONE_KEY if target_vault is None else _MANY_KEYS)
    locked = _LOCKED.format(
        vault=vault, which="" if target_vault is None else f"of the {vault} vault "
    )
    resume = {"command": _RESUME}
    prefix = call_text("unlock_vault", {"vault": vault, "pass_key": "@KEY@"}).split("@KEY@")[0]
    fixed = [SYSTEM_PROMPT, task, call_text("run_command", resume), locked, prefix]
    overhead = (
        sum(count_tokens(text) for text in fixed)
        + sum(count_tokens(json.dumps(tool)) for tool in TOOLS)
        + _TOOLS_MARKUP
        + 3 * _ROUND_MARKUP
    )
    budget = max(64, round((length - overhead) * _LINE_COUNT_BIAS))

    def render_call(name: str, key: str, arg: str) -> str:
        return call_text(name, {key: arg})

    rounds = tool_rounds(rng, budget, needles, count_tokens, render_call, _ROUND_MARKUP, trim=True)
    messages = [Message(Role.SYSTEM, SYSTEM_PROMPT), Message(Role.USER, task)]
    for i, (name, key, arg, lines) in enumerate(rounds):
        messages += tool_round(f"call_{i}", name, {key: arg}, "\n".join(lines))
    messages += tool_round(f"call_{len(rounds)}", "run_command", resume, locked)
    return AgentLoop(messages=messages, tools=TOOLS, answer_prefix=prefix)


def tool_round(call_id: str, name: str, arguments: dict[str, str], result: str) -> list[Message]:
    """An assistant message with one OpenAI tool call, and the tool message with its result."""
    call = ToolCall(id=call_id, name=name, arguments=json.dumps(arguments))
    return [
        Message(Role.ASSISTANT, "", tool_calls=(call,)),
        Message(Role.TOOL, result, tool_call_id=call_id),
    ]
