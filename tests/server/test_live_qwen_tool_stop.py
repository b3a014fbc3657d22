"""Qwen2.5-Coder-0.5B-Instruct: a tool-call reply ends at the call block (issue 29).

With one tool `get_weather(city)`, greedy decoding and the official `openai` client:
- "What is the weather in Paris?": the model writes one fenced bare-JSON call and ends;
  the reply is that one call, finish `tool_calls`, no content.
- After the tool's result the model calls the tool again and repeats the call until
  `max_tokens` (the run-on seen with agent frameworks). The reply is one call, and
  generation stopped where the repeat closed: `completion_tokens` covers exactly the call
  and its repeat, while the raw completion of the same prompt (no tool parsing) goes on
  with a third copy.
Streamed replies carry the same call, finish reason and usage. Prompts stay small (Qwen
prefills at 50-200 tokens/s on two shared cores).
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
            "name": "get_weather",
            "description": "Get the current weather in a city.",
            "parameters": {
                "title": "get_weather_args",
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
AFTER_RESULT = [
    *QUESTION,
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"},
]
CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    pytest.importorskip("kvmem.models")
    logs: Path = tmp_path_factory.mktemp("qwen-stop-logs")
    server = start_server(["-m", "qwen-0.5b", "-c", "4096", "-t", "2", "--temp", "0"], logs)
    yield server
    assert server.stop() == 0, server.log()[-3000:]


def _calls(message: Any) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]


def _streamed(client: openai.OpenAI, messages: list[dict]) -> tuple[str, list[tuple], str, int]:
    content, names, args, finish, tokens = "", {}, {}, "", -1
    stream = client.chat.completions.create(
        model="qwen",
        messages=messages,
        tools=TOOLS,
        max_tokens=120,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        finish = choice.finish_reason or finish
        for d in choice.delta.tool_calls or []:
            names[d.index] = names.get(d.index, "") + (d.function.name or "")
            args[d.index] = args.get(d.index, "") + (d.function.arguments or "")
    calls = [(names[i], json.loads(args[i])) for i in sorted(names)]
    return content, calls, finish, tokens


def _ask(client: openai.OpenAI, messages: list[dict]) -> Any:
    return client.chat.completions.create(
        model="qwen", messages=messages, tools=TOOLS, max_tokens=120, temperature=0
    )


def test_one_call_and_nothing_else(qwen: LiveServer) -> None:
    client = qwen.client()
    res = _ask(client, QUESTION)
    choice = res.choices[0]
    assert _calls(choice.message) == [("get_weather", {"city": "Paris"})]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    # ```json\n{\n  "name": ... }\n``` : 28 tokens, the closing fence included
    assert res.usage.completion_tokens == 28
    assert _streamed(client, QUESTION) == (
        "",
        [("get_weather", {"city": "Paris"})],
        "tool_calls",
        28,
    )


def test_a_repeated_call_ends_the_reply_where_the_repeat_closes(qwen: LiveServer) -> None:
    client = qwen.client()
    res = _ask(client, AFTER_RESULT)
    choice = res.choices[0]
    assert _calls(choice.message) == [("get_weather", {"city": "Paris"})]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    used = res.usage.completion_tokens
    assert used < 120
    assert _streamed(client, AFTER_RESULT) == (
        "",
        [("get_weather", {"city": "Paris"})],
        "tool_calls",
        used,
    )
    with qwen.http() as http:
        prompt = http.post("/apply-template", json={"messages": AFTER_RESULT, "tools": TOOLS})
        raw = http.post(
            "/completion",
            json={
                "prompt": prompt.json()["prompt"],
                "n_predict": used + 4,
                "temperature": 0,
                "return_tokens": True,
            },
        ).json()
        upto_stop = http.post("/detokenize", json={"tokens": raw["tokens"][:used]}).json()
    # the same greedy tokens without tool parsing: generation stopped at the token that
    # closed the repeat (`}}` + newline is one token), and the model was going on with a
    # third copy
    assert upto_stop["content"] == f"{CALL}\n{CALL}\n"
    assert raw["content"].startswith(f"{CALL}\n{CALL}\n{{")
    assert raw["tokens_predicted"] == used + 4
