"""Tool calls while streaming: content before a call flows, calls come out whole."""

from __future__ import annotations

import json

import pytest

from kvmem.chat.tool_calls import ToolCall, ToolFormat
from kvmem.chat.tool_stream import ToolCallStream


def feed(stream: ToolCallStream, deltas: list[str]) -> list[object]:
    out: list[object] = []
    for delta in deltas:
        out += stream.push(delta)
    out += stream.finish()
    return [(i.name, json.loads(i.arguments)) if isinstance(i, ToolCall) else i for i in out]


def chars(text: str) -> list[str]:
    return list(text)


def test_hermes_calls_emitted_as_each_block_closes() -> None:
    stream = ToolCallStream(ToolFormat.HERMES, [])
    text = 'Checking.\n<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n<tool_call>\n{"name": "b", "arguments": {}}\n</tool_call>'
    out: list[object] = []
    first_call_at = None
    for i, ch in enumerate(text):
        got = stream.push(ch)
        if any(isinstance(g, ToolCall) for g in got) and first_call_at is None:
            first_call_at = i
        out += got
    out += stream.finish()
    assert first_call_at == text.index("</tool_call>") + len("</tool_call>") - 1
    assert "".join(o for o in out if isinstance(o, str)) == "Checking.\n"
    assert [(c.name, json.loads(c.arguments)) for c in out if isinstance(c, ToolCall)] == [
        ("a", {"x": 1}),
        ("b", {}),
    ]


def test_partial_marker_is_held_then_released() -> None:
    stream = ToolCallStream(ToolFormat.HERMES, [])
    assert stream.push("a <tool") == ["a "]
    assert stream.push("box> b") == ["<toolbox> b"]
    assert stream.finish() == []


@pytest.mark.parametrize(
    ("fmt", "text", "expected"),
    [
        (ToolFormat.LLAMA3_JSON, ' {"name": "f", "parameters": {"q": "x"}}', [("f", {"q": "x"})]),
        (ToolFormat.LLAMA3_JSON, "Answer: {not a call}", ["Answer: {not a call}"]),
        (ToolFormat.MISTRAL, 'Ok[TOOL_CALLS][{"name": "f", "arguments": {}}]', ["Ok", ("f", {})]),
        (
            ToolFormat.QWEN3_CODER,
            "<tool_call>\n<function=f>\n<parameter=n>\n2\n</parameter>\n</function>\n</tool_call>",
            [("f", {"n": 2})],
        ),
        (
            ToolFormat.HERMES,
            "<tool_call>\n{broken\n</tool_call> after",
            ["<tool_call>\n{broken\n</tool_call> after"],
        ),
        (ToolFormat.HERMES, '<tool_call>\n{"name": "f", "arguments": {}}', [("f", {})]),
        (ToolFormat.HERMES, "   ", []),
    ],
)
def test_formats_streamed_character_by_character(
    fmt: ToolFormat, text: str, expected: list[object]
) -> None:
    out = feed(ToolCallStream(fmt, []), chars(text))
    merged: list[object] = []
    for item in out:
        if isinstance(item, str) and merged and isinstance(merged[-1], str):
            merged[-1] += item
        else:
            merged.append(item)
    assert merged == expected
