"""The requests of the 256K tool benchmark: a base request plus tool-result rounds.

Round 0 is the base request (system prompt, a task and a first large tool result);
round k appends one fixed assistant tool call and its tool result. The assistant turns
are fixed by the benchmark, not taken from the model's output, so every configuration
receives byte-identical requests. Sizes are set in characters from a chars-per-token
estimate, so the requests never depend on the server's tokenizer.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from enum import Enum
from typing import Any

from kvmem.bench import content

SYSTEM_PROMPT = (
    "You are a coding agent working in a large repository. Call tools to read files, run "
    "commands and query the database. Keep each turn short."
)
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {"input": {"type": "string"}},
                "required": ["input"],
            },
        },
    }
    for name, description in (
        ("read_file", "Read a file of the repository."),
        ("run_command", "Run a shell command and return its output."),
        ("query_db", "Run a read-only SQL query."),
    )
]


# measured: the SmolLM2 tokenizer on these tool outputs (tests/bench/test_tools_bench.py)
DEFAULT_CHARS_PER_TOKEN = 2.57


class ToolFormat(Enum):
    OPENAI = "openai"  # assistant tool_calls + role=tool messages with tool_call_id
    TEXT = "text"  # assistant <tool_call> text + role=tool messages


@dataclass(frozen=True, slots=True)
class ToolsPlan:
    rounds: int = 32
    target_tokens: int = 262144  # prompt + generation of the last request
    gen_tokens: int = 256  # max_tokens of every request
    chars_per_token: float = DEFAULT_CHARS_PER_TOKEN
    seed: int = 0
    tool_format: ToolFormat = ToolFormat.OPENAI

    @property
    def segment_chars(self) -> int:
        """Characters of the base request's tool result and of each round's tool result."""
        tokens = (self.target_tokens - (self.rounds + 1) * self.gen_tokens) / (self.rounds + 1)
        return max(200, int(tokens * self.chars_per_token))


def tool_text(rng: random.Random, n_chars: int) -> str:
    """Tool output (logs, JSON, source, prose in turn) of about `n_chars` characters."""
    parts: list[str] = []
    size = 0
    kind = rng.randrange(4)
    while size < n_chars:
        piece = content.tool_output(rng, kind, 20)
        parts.append(piece)
        size += len(piece) + 1
        kind += 1
    return "\n".join(parts)[:n_chars]


def _call(plan: ToolsPlan, index: int, rng: random.Random) -> tuple[dict[str, Any], str]:
    name = ("read_file", "run_command", "query_db")[index % 3]
    arg = {
        "read_file": f"src/{rng.choice(content.NOUNS)}/{rng.choice(content.NOUNS)}.py",
        "run_command": f"grep -rn {rng.choice(content.NOUNS)} logs/",
        "query_db": f"SELECT * FROM orders WHERE city = '{rng.choice(content.CITIES)}'",
    }[name]
    call_id = f"call_{index:03d}"
    arguments = json.dumps({"input": arg})
    if plan.tool_format is ToolFormat.OPENAI:
        message = {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                }
            ],
        }
    else:
        message = {
            "role": "assistant",
            "content": f'<tool_call>{{"name": "{name}", "arguments": {arguments}}}</tool_call>',
        }
    return message, call_id


def _result(plan: ToolsPlan, call_id: str, text: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "tool", "content": text}
    if plan.tool_format is ToolFormat.OPENAI:
        message["tool_call_id"] = call_id
    return message


def build_conversations(plan: ToolsPlan) -> list[list[dict[str, Any]]]:
    """The messages of request 0 (base) .. request `rounds`; each extends the previous."""
    rng = random.Random(f"tools/{plan.seed}")
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {
            "role": "user",
            "content": "Find out why the nightly export fails and propose a fix. "
            "Start by reading the export module.",
        },
    ]
    call, call_id = _call(plan, 0, rng)
    messages += [call, _result(plan, call_id, tool_text(rng, plan.segment_chars))]
    requests = [list(messages)]
    for k in range(1, plan.rounds + 1):
        call, call_id = _call(plan, k, rng)
        messages += [call, _result(plan, call_id, tool_text(rng, plan.segment_chars))]
        requests.append(list(messages))
    return requests


def request_body(
    plan: ToolsPlan, messages: list[dict[str, Any]], model: str, stream: bool, ignore_eos: bool
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "max_tokens": plan.gen_tokens,
        "temperature": 0.0,
        "stream": stream,
        "seed": plan.seed,
    }
    if plan.tool_format is ToolFormat.OPENAI:
        body["tools"] = TOOLS
    if stream:
        body["stream_options"] = {"include_usage": True}
    if ignore_eos:
        body["ignore_eos"] = True
    return body
