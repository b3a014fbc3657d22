"""Responses items and Anthropic blocks -> chat messages, and the requests' translation."""

from __future__ import annotations

import pytest

from kvmem.chat import anthropic_blocks, response_items
from kvmem.errors import InvalidRequestError
from kvmem.server.anthropic_schema import chat_request as anthropic_chat
from kvmem.server.anthropic_schema import parse_messages_request
from kvmem.server.responses_schema import chat_request as responses_chat
from kvmem.server.responses_schema import parse_responses_request, request_messages

CALL = {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": '{"a": 1}'}


def test_response_input_string_and_items() -> None:
    assert response_items.input_messages("hi") == [{"role": "user", "content": "hi"}]
    items = [
        {"role": "developer", "content": "rules"},
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}],
        },
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "hmm"}],
        },
        CALL,
        {**CALL, "call_id": "call_2"},
        {"type": "function_call_output", "call_id": "call_1", "output": "one"},
        {
            "type": "function_call_output",
            "call_id": "call_2",
            "output": [{"type": "input_text", "text": "two"}],
        },
        {"role": "assistant", "content": [{"type": "output_text", "text": "done"}]},
    ]
    tc = {"type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    assert response_items.input_messages(items) == [
        {"role": "developer", "content": "rules"},
        {"role": "user", "content": "a\nb"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "call_1", **tc}, {"id": "call_2", **tc}],
            "reasoning_content": "hmm",
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "one"},
        {"role": "tool", "tool_call_id": "call_2", "content": "two"},
        {"role": "assistant", "content": "done"},
    ]


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        ([], "input"),
        (7, "input"),
        ([{"type": "input_image"}], "input[0].type"),
        ([{"type": "item_reference", "id": "x"}], "input[0].type"),
        ([{"role": "tool", "content": "x"}], "input[0].role"),
        ([{"role": "user"}], "input[0].content"),
        ([{"role": "user", "content": [{"type": "input_audio"}]}], "input[0].content[0].type"),
        ([{**CALL, "arguments": {"a": 1}}], "input[0].arguments"),
        ([CALL, {**CALL, "arguments": "[1, 2]"}], "input[1].arguments"),
        ([CALL, {**CALL, "arguments": "[" * 200 + "]" * 200}], "input[1].arguments"),
        ([CALL, {**CALL, "arguments": '{"a": ' + "9" * 5000 + "}"}], "input[1].arguments"),
        ([CALL, {**CALL, "arguments": '{"a": "\\ud800"}'}], "input[1].arguments"),
        ([CALL, {**CALL, "arguments": '{"a": '}], "input[1].arguments"),
        ([{**CALL, "call_id": ""}], "input[0].call_id"),
        ([{"type": "function_call_output", "call_id": "c"}], "input[0].output"),
    ],
)
def test_response_input_errors_name_the_item(raw: object, param: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        response_items.input_messages(raw)
    assert info.value.param == param


def test_response_tools_and_tool_choice() -> None:
    tool = {"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": True}
    assert response_items.chat_tools([tool]) == [
        {
            "type": "function",
            "function": {"name": "f", "parameters": {"type": "object"}, "strict": True},
        }
    ]
    with pytest.raises(InvalidRequestError) as info:
        response_items.chat_tools([{"type": "file_search"}])
    assert info.value.param == "tools[0].type"
    assert response_items.chat_tool_choice({"type": "function", "name": "f"}) == {
        "type": "function",
        "function": {"name": "f"},
    }
    assert response_items.chat_tool_choice("required") == "required"
    with pytest.raises(InvalidRequestError):
        response_items.chat_tool_choice({"type": "allowed_tools", "tools": []})


def test_responses_request_becomes_a_chat_request() -> None:
    r = parse_responses_request(
        {
            "model": "m",
            "input": "hi",
            "instructions": "be brief",
            "max_output_tokens": 5,
            "temperature": 0.5,
            "reasoning": {"effort": "low", "summary": "auto"},
            "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
        }
    )
    previous = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    chat = responses_chat(r, request_messages(r, previous))
    assert chat.messages == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "hi"},
    ]
    assert (chat.max_tokens, chat.temperature, chat.reasoning_effort) == (5, 0.5, "low")
    assert chat.response_format is not None and chat.response_format.type == "json_schema"
    assert chat.response_format.json_schema.schema_ == {"type": "object"}  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"input": "x", "top_logprobs": 2}, "top_logprobs", "'top_logprobs' is not supported"),
        ({"input": "x", "reasoning": {"effort": "low", "x": 1}}, "reasoning.x", "is not supported"),
        ({"input": "x", "temperature": "hot"}, "temperature", "invalid 'temperature'"),
        ({"input": "x", "truncation": "auto"}, "truncation", "invalid 'truncation'"),
    ],
)
def test_responses_schema_errors(body: dict, param: str, message: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        parse_responses_request(body)
    assert info.value.param == param and message in str(info.value)


def test_responses_chat_errors_use_responses_names() -> None:
    r = parse_responses_request(
        {"input": [{"role": "user", "content": "x"}], "tool_choice": "required"}
    )
    with pytest.raises(InvalidRequestError) as info:
        responses_chat(r, request_messages(r, None))
    assert info.value.param == "tool_choice"
    r = parse_responses_request({"input": "x", "reasoning": {"effort": "LOUD"}})
    with pytest.raises(InvalidRequestError) as info:
        responses_chat(r, request_messages(r, None))
    assert info.value.param == "reasoning.effort"


def test_anthropic_blocks_become_chat_messages() -> None:
    system = [
        {"type": "text", "text": "s1", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "s2"},
    ]
    messages = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "plan", "signature": ""},
                {"type": "text", "text": "calling"},
                {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": "é"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "also"},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": [{"type": "text", "text": "ok"}],
                },
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "content": "bad",
                    "is_error": True,
                },
            ],
        },
    ]
    assert anthropic_blocks.chat_messages(system, messages) == [
        {"role": "system", "content": "s1\ns2"},
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "calling",
            "reasoning_content": "plan",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "f", "arguments": '{"a": "é"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "ok"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: bad"},
        {"role": "user", "content": "also"},
    ]
    assert messages[2]["content"][1]["content"] == [{"type": "text", "text": "ok"}]  # not mutated


@pytest.mark.parametrize(
    ("messages", "where"),
    [
        ([], "messages"),
        ([{"role": "system", "content": "x"}], "messages.0.role"),
        (
            [{"role": "user", "content": [{"type": "image", "source": {}}]}],
            "messages.0.content.0.type",
        ),
        (
            [
                {
                    "role": "user",
                    "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}],
                }
            ],
            "messages.0.content.0.type",
        ),
        (
            [{"role": "assistant", "content": [{"type": "redacted_thinking", "data": "x"}]}],
            "messages.0.content.0.type",
        ),
        (
            [
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "a", "name": "f", "input": []}],
                }
            ],
            "messages.0.content.0.input",
        ),
        (
            [{"role": "user", "content": [{"type": "text", "text": "x", "bogus": 1}]}],
            "messages.0.content.0.bogus",
        ),
        ([{"role": "user", "content": "x", "name": "n"}], "messages.0"),
    ],
)
def test_anthropic_block_errors_name_the_block(messages: list, where: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        anthropic_blocks.chat_messages(None, messages)
    assert info.value.param == where


def test_anthropic_tools_and_tool_choice() -> None:
    tool = {"name": "f", "description": "d", "input_schema": {"type": "object"}}
    assert anthropic_blocks.chat_tools([tool]) == [
        {
            "type": "function",
            "function": {"name": "f", "parameters": {"type": "object"}, "description": "d"},
        }
    ]
    with pytest.raises(InvalidRequestError) as info:
        anthropic_blocks.chat_tools([{"type": "bash_20250124", "name": "bash"}])
    assert info.value.param == "tools.0.type"
    with pytest.raises(InvalidRequestError) as info:
        anthropic_blocks.chat_tools([{"name": "f"}])
    assert info.value.param == "tools.0.input_schema"
    choice = anthropic_blocks.chat_tool_choice
    assert choice({"type": "auto"}) == ("auto", None)
    assert choice({"type": "any", "disable_parallel_tool_use": True}) == ("required", False)
    assert choice({"type": "none"}) == ("none", None)
    assert choice({"type": "tool", "name": "f"}) == (
        {"type": "function", "function": {"name": "f"}},
        None,
    )
    with pytest.raises(InvalidRequestError):
        choice({"type": "tool"})
    with pytest.raises(InvalidRequestError):
        choice({"type": "auto", "name": "f"})


def test_anthropic_request_becomes_a_chat_request() -> None:
    r = parse_messages_request(
        {
            "model": "m",
            "max_tokens": 100,
            "messages": [{"role": "user", "content": "hi"}],
            "stop_sequences": ["END"],
            "top_k": 5,
            "thinking": {"type": "enabled", "budget_tokens": 40},
            "metadata": {"user_id": "u"},
            "tools": [{"name": "f", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any"},
        }
    )
    chat = anthropic_chat(r)
    assert chat.messages == [{"role": "user", "content": "hi"}]
    assert (chat.max_tokens, chat.stop, chat.top_k) == (100, ["END"], 5)
    assert chat.chat_template_kwargs == {"enable_thinking": True}
    assert chat.reasoning_budget_tokens == 40
    assert (chat.tool_choice, chat.parallel_tool_calls) == ("required", True)
    off = parse_messages_request(
        {
            "model": "m",
            "max_tokens": 9,
            "messages": [{"role": "user", "content": "x"}],
            "thinking": {"type": "disabled"},
        }
    )
    assert anthropic_chat(off).chat_template_kwargs == {"enable_thinking": False}
    over = parse_messages_request(
        {
            "model": "m",
            "max_tokens": 9,
            "messages": [{"role": "user", "content": "x"}],
            "thinking": {"type": "enabled", "budget_tokens": 9},
        }
    )
    with pytest.raises(InvalidRequestError) as info:
        anthropic_chat(over)
    assert info.value.param == "thinking.budget_tokens"
    bad_stop = parse_messages_request(
        {
            "model": "m",
            "max_tokens": 9,
            "messages": [{"role": "user", "content": "x"}],
            "stop_sequences": [""],
        }
    )
    with pytest.raises(InvalidRequestError) as info:
        anthropic_chat(bad_stop)
    assert info.value.param == "stop_sequences"
