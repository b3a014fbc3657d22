"""Bare-JSON tool calls (no <tool_call> tags) in the Hermes format, parsed and streamed."""

from __future__ import annotations

import json

import pytest

from kvmem.chat.tool_calls import ToolCall, ToolFormat, parse_tool_calls
from kvmem.chat.tool_stream import ToolCallStream

TOOLS = [
    {"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "list_dir", "parameters": {"type": "object"}}},
]
CALL = '{"name": "read_file", "arguments": {"path": "a.py"}}'


def calls(text: str, tools=TOOLS) -> tuple[str, list[tuple[str, dict]]]:
    parsed = parse_tool_calls(text, ToolFormat.HERMES, tools)
    return parsed.content, [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls]


@pytest.mark.parametrize(
    "text",
    [
        CALL,
        f"\n  {CALL}\n",
        f"```json\n{CALL}\n```",
        f"```\n{CALL}\n```",
        '{"name": "read_file", "parameters": {"path": "a.py"}}',
    ],
)
def test_bare_object_naming_a_given_tool_is_a_call(text: str) -> None:
    assert calls(text) == ("", [("read_file", {"path": "a.py"})])


def test_several_bare_objects_are_parallel_calls() -> None:
    text = CALL + '\n{"name": "list_dir", "arguments": {}}'
    assert calls(text) == ("", [("read_file", {"path": "a.py"}), ("list_dir", {})])


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "delete_all", "arguments": {}}',  # not a given tool
        f"Sure: {CALL}",  # text before the object
        '{"name": "read_file", "arguments": [1]}',  # arguments not an object
        '{"answer": 42}',
        '{"name": "read_file", "arguments": {"path": ',  # cut short
    ],
)
def test_other_json_stays_content(text: str) -> None:
    assert calls(text) == (text, [])


@pytest.mark.parametrize(
    "after",
    [
        '\n{"name": "main.py", "arguments": {}}\n{"name": "read_file", "argu',  # run-on, cut
        " and more",  # prose after the call
        '\n{"name": "get_weather_args", "type": "object", "properties": {}}',  # the schema
        "\n```\nThe call reads a.py.",  # after a code fence that never opened
    ],
)
def test_text_after_the_last_call_is_not_content(after: str) -> None:
    assert calls(CALL + after) == ("", [("read_file", {"path": "a.py"})])


def test_repeated_identical_calls_are_one_call() -> None:
    repeated = "\n".join([CALL] * 20)
    assert calls(repeated) == ("", [("read_file", {"path": "a.py"})])
    reordered = '{"name": "read_file", "arguments": {"path": "a.py"}}\n' * 2
    assert calls(reordered + '{"arguments": {"path": "a.py"}, "name": "read_file"}') == (
        "",
        [("read_file", {"path": "a.py"})],
    )


def test_without_tools_the_same_output_is_content() -> None:
    assert calls(CALL, tools=[]) == (CALL, [])


def test_tagged_calls_still_win() -> None:
    text = f"<tool_call>\n{CALL}\n</tool_call>"
    assert calls(text) == ("", [("read_file", {"path": "a.py"})])


def feed(deltas: list[str]) -> list[object]:
    stream = ToolCallStream(ToolFormat.HERMES, TOOLS)
    out: list[object] = []
    for d in deltas:
        out += stream.push(d)
    out += stream.finish()
    return [(i.name, json.loads(i.arguments)) if isinstance(i, ToolCall) else i for i in out]


@pytest.mark.parametrize("text", [CALL, f"```json\n{CALL}\n```"])
def test_streamed_bare_call_equals_parsed(text: str) -> None:
    assert feed(list(text)) == [("read_file", {"path": "a.py"})]


def test_streamed_prose_flows_and_json_answer_comes_back_as_content() -> None:
    assert "".join(feed(list("Hello {there}"))) == "Hello {there}"  # type: ignore[arg-type]
    answer = '{"answer": 42}'
    assert "".join(feed(list(answer))) == answer  # type: ignore[arg-type]
