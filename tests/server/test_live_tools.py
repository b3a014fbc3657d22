"""A tool-call round trip against the real server.

SmolLM2-135M does not call tools reliably on its own, so the call is forced the way
llama-server forces it: `tool_choice` naming the function makes the server constrain the
output with a GBNF grammar in the template's tool-call format (Hermes for SmolLM2, whose
template has no tool support and gets the Hermes polyfill). The parser then turns the
model's real output into `tool_calls`.
"""

from __future__ import annotations

import json

import pytest

from tests.server.conftest import LiveServer

pytestmark = pytest.mark.slow

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather of a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "enum": ["Paris", "London", "Tokyo"]}},
                "required": ["city"],
            },
        },
    }
]
FORCE = {"type": "function", "function": {"name": "get_weather"}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_tool_call_round_trip(main_server: LiveServer) -> None:
    client = main_server.client()
    first = client.chat.completions.create(
        model="smol", messages=ASK, tools=TOOLS, tool_choice=FORCE, temperature=0, max_tokens=64
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    calls = choice.message.tool_calls
    assert calls is not None and len(calls) >= 1
    call = calls[0]
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"] in ("Paris", "London", "Tokyo")
    assert call.id.startswith("call_")

    history = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.function.name, "arguments": c.function.arguments},
                }
                for c in calls
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 degrees Celsius."},
    ]
    second = client.chat.completions.create(
        model="smol", messages=history, tools=TOOLS, temperature=0, max_tokens=24
    )
    answer = second.choices[0]
    assert answer.finish_reason in ("stop", "length", "tool_calls")
    assert answer.message.content or answer.message.tool_calls
    assert first.usage is not None and second.usage is not None
    details = second.usage.prompt_tokens_details
    assert details is not None and details.cached_tokens is not None
    # the tool turn reuses the KV of the prompt and of the call the model generated
    assert details.cached_tokens >= first.usage.prompt_tokens


def test_forced_tool_call_streams_indexed_deltas(main_server: LiveServer) -> None:
    stream = main_server.client().chat.completions.create(
        model="smol",
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        temperature=0,
        max_tokens=64,
        stream=True,
    )
    chunks = list(stream)
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    tool_deltas = [tc for d in deltas for tc in (d.tool_calls or [])]
    assert tool_deltas, "the forced call must stream tool-call deltas"
    assert tool_deltas[0].id is not None and tool_deltas[0].function is not None
    assert tool_deltas[0].function.name == "get_weather"
    assert all(t.id is None for t in tool_deltas[1:] if t.index == tool_deltas[0].index)
    arguments = "".join(
        t.function.arguments or "" for t in tool_deltas if t.function and t.index == 0
    )
    assert json.loads(arguments)["city"] in ("Paris", "London", "Tokyo")
    assert [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ] == ["tool_calls"]
    assert not any(d.content for d in deltas)
