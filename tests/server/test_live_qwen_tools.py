"""Qwen2.5-Coder-0.5B-Instruct tool calls through the `openai` client: a scripted agent loop.

Three tool rounds: in the first two the model calls tools on its own (Qwen2.5-Coder-0.5B
writes them tagged or as bare JSON) and the client gets `tool_calls`; after the second
result the model rambles, so the third round asks with `tool_choice: "required"` (the
grammar-forced call). In every round the streamed tool-call deltas add up to the
non-streamed calls.
Greedy decoding keeps the run deterministic; prompts stay small (Qwen prefills at about
100 tokens/s on 2 cores).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.server.conftest import LiveServer, start_server

pytestmark = pytest.mark.slow

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a text file and return its content.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "list_dir",
            "description": "List the files of a directory.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    },
]
FILES = {
    ".": "main.py\nconfig.json\n",
    "main.py": "import json\nprint(json.load(open('config.json'))['name'])\n",
    "config.json": '{"name": "kvmem"}\n',
}
TASK = (
    "Use the tools. First list the directory '.', then read main.py, then read config.json, "
    "then tell me what main.py prints."
)


@pytest.fixture(scope="module")
def qwen_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    pytest.importorskip("kvmem.models")
    logs: Path = tmp_path_factory.mktemp("qwen-logs")
    server = start_server(["-m", "qwen-0.5b", "-c", "4096", "-t", "2", "--temp", "0"], logs)
    yield server
    assert server.stop() == 0, server.log()[-3000:]


def _tool_result(call: dict[str, Any]) -> str:
    args = json.loads(call["function"]["arguments"])
    path = str(args.get("path", "."))
    return FILES.get(path.removeprefix("./") or ".", f"error: {path} not found")


def _streamed(
    client: Any, messages: list[dict[str, Any]], choice: str
) -> tuple[str, list[dict], str]:
    content, calls, finish = "", [], ""
    stream = client.chat.completions.create(
        model="qwen",
        messages=messages,
        tools=TOOLS,
        tool_choice=choice,
        max_tokens=160,
        stream=True,
        temperature=0,
    )
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        finish = choice.finish_reason or finish
        for d in choice.delta.tool_calls or []:
            if d.index >= len(calls):
                calls.append({"id": d.id, "function": {"name": "", "arguments": ""}})
            fn = calls[d.index]["function"]
            fn["name"] += d.function.name or "" if d.function else ""
            fn["arguments"] += d.function.arguments or "" if d.function else ""
    return content, calls, finish


def test_three_tool_rounds_stream_equals_non_stream(qwen_server: LiveServer) -> None:
    client = openai.OpenAI(base_url=qwen_server.base_url + "/v1", api_key="none", timeout=1800)
    messages: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
    rounds = 0
    for tool_choice in ("auto", "auto", "required"):
        res = client.chat.completions.create(
            model="qwen",
            messages=messages,
            tools=TOOLS,
            tool_choice=tool_choice,
            max_tokens=160,
            temperature=0,
        )
        choice = res.choices[0]
        content, streamed_calls, finish = _streamed(client, messages, tool_choice)
        calls = [c.model_dump() for c in choice.message.tool_calls or []]
        assert calls, f"round {rounds}: no tool call; content {choice.message.content!r}"
        assert choice.finish_reason == finish == "tool_calls"
        assert "<tool_call>" not in (choice.message.content or "")
        assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
            (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in streamed_calls
        ]
        assert {c["function"]["name"] for c in calls} <= {"read_file", "list_dir"}
        messages.append(
            {"role": "assistant", "content": choice.message.content, "tool_calls": calls}
        )
        for call in calls:
            messages.append(
                {"role": "tool", "tool_call_id": call["id"], "content": _tool_result(call)}
            )
        rounds += 1
    assert rounds == 3
