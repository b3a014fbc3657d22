"""The stop condition of a tool-call reply (issue 29), per format, through run_turn.

The fake engine emits one token per character, so `completion_tokens` is exactly the
number of characters generated before the turn stopped: the call block, plus the few
characters after it that showed no further call begins.
"""

from __future__ import annotations

import json

import pytest

from kvmem.chat.prompt import PromptTokens
from kvmem.chat.tool_calls import ToolCall, ToolFormat
from kvmem.chat.tool_stream import ToolCallStream
from kvmem.chat.turn import ChatFinish, TextDelta, ToolCallEvent, TurnDone, TurnRequest, run_turn
from kvmem.memory.spans import TokenSpan
from tests.fakes.engine import FakeEngine

TOOLS = [
    {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
    for n in ("get_weather", "get_time")
]
PARIS = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
OSLO = '{"name": "get_weather", "arguments": {"city": "Oslo"}}'
TAGGED = f"<tool_call>\n{PARIS}\n</tool_call>"
SCHEMA_RUN_ON = '\n{"name": "get_weather_args", "type": "object", "properties": {}}\n' * 5


def turn(
    reply: str, fmt: ToolFormat = ToolFormat.HERMES, **kw: object
) -> tuple[str, list[tuple[str, dict]], ChatFinish, int]:
    """(content, calls, finish, completion_tokens) of one turn on a scripted reply."""
    engine = FakeEngine(replies=[reply])
    req = TurnRequest(
        prompt=PromptTokens([81], TokenSpan(0, 1), "Q", False), tool_format=fmt, tools=TOOLS
    )
    for key, value in kw.items():
        setattr(req, key, value)
    content, calls = "", []
    events = list(run_turn(engine, req))
    for ev in events[:-1]:
        if isinstance(ev, TextDelta):
            content += ev.text
        elif isinstance(ev, ToolCallEvent):
            calls.append((ev.call.name, json.loads(ev.call.arguments)))
    done = events[-1]
    assert isinstance(done, TurnDone)
    assert engine.last_turn.generated_tokens == done.usage.completion_tokens
    return content, calls, done.finish_reason, done.usage.completion_tokens


def test_run_on_after_a_tagged_call_is_not_generated() -> None:
    reply = "Let me check.\n" + TAGGED + SCHEMA_RUN_ON
    stopped_at = len("Let me check.\n" + TAGGED + '\n{"name": "get_weather_')
    assert turn(reply) == (
        "Let me check.\n",
        [("get_weather", {"city": "Paris"})],
        ChatFinish.TOOL_CALLS,
        stopped_at,
    )


def test_prose_after_a_call_stops_at_its_first_character() -> None:
    reply = TAGGED + "\nThe weather in Paris is sunny."
    assert turn(reply) == (
        "",
        [("get_weather", {"city": "Paris"})],
        ChatFinish.TOOL_CALLS,
        len(TAGGED) + 2,
    )


def test_parallel_calls_continue_and_the_end_of_generation_ends_them() -> None:
    reply = f"{TAGGED}\n<tool_call>\n{OSLO}\n</tool_call>\n"
    assert turn(reply) == (
        "",
        [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Oslo"})],
        ChatFinish.TOOL_CALLS,
        len(reply),
    )


def test_without_parallel_the_first_call_ends_the_reply() -> None:
    reply = f"{TAGGED}\n<tool_call>\n{OSLO}\n</tool_call>"
    assert turn(reply, parallel_tool_calls=False) == (
        "",
        [("get_weather", {"city": "Paris"})],
        ChatFinish.TOOL_CALLS,
        len(TAGGED),
    )


def test_a_repeated_bare_call_is_one_call_and_ends_the_reply() -> None:
    reply = "\n".join([PARIS] * 20)
    assert turn(reply) == (
        "",
        [("get_weather", {"city": "Paris"})],
        ChatFinish.TOOL_CALLS,
        2 * len(PARIS) + 1,
    )


def test_a_bare_call_followed_by_schema_text_stops_where_the_name_differs() -> None:
    reply = PARIS + SCHEMA_RUN_ON
    assert turn(reply) == (
        "",
        [("get_weather", {"city": "Paris"})],
        ChatFinish.TOOL_CALLS,
        len(PARIS + '\n{"name": "get_weather_'),
    )


def test_a_fenced_bare_call_stops_at_the_closing_fence() -> None:
    reply = f"```json\n{PARIS}\n```\nThis asks for the weather."
    assert turn(reply) == (
        "",
        [("get_weather", {"city": "Paris"})],
        ChatFinish.TOOL_CALLS,
        len(f"```json\n{PARIS}\n`"),
    )


def test_a_call_cut_off_by_max_tokens_is_length_and_content() -> None:
    reply = TAGGED
    assert turn(reply, max_tokens=30) == (reply[:30], [], ChatFinish.LENGTH, 30)


def test_a_second_call_cut_off_keeps_the_first_and_reports_length() -> None:
    reply = f"{TAGGED}\n<tool_call>\n{OSLO}\n</tool_call>"
    limit = len(TAGGED) + 30
    assert turn(reply, max_tokens=limit) == (
        "",
        [("get_weather", {"city": "Paris"})],
        ChatFinish.LENGTH,
        limit,
    )


def test_max_tokens_reached_while_looking_past_a_call_is_tool_calls() -> None:
    reply = TAGGED + "\n\n\n\nmore"
    assert turn(reply, max_tokens=len(TAGGED) + 2) == (
        "",
        [("get_weather", {"city": "Paris"})],
        ChatFinish.TOOL_CALLS,
        len(TAGGED) + 2,
    )


def test_plain_prose_is_unchanged() -> None:
    reply = "It is sunny in Paris. {not a call}"
    assert turn(reply) == (reply, [], ChatFinish.STOP, len(reply))


def test_json_that_is_no_call_stays_content_and_generation_goes_on() -> None:
    reply = '{"answer": 42} and more'
    assert turn(reply) == (reply, [], ChatFinish.STOP, len(reply))


QWEN3 = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"


@pytest.mark.parametrize(
    ("fmt", "call", "after"),
    [
        (ToolFormat.QWEN3_CODER, QWEN3, "\nI"),
        (ToolFormat.QWEN3_CODER, QWEN3[len("<tool_call>\n") : -len("\n</tool_call>")], "\nD"),
        (ToolFormat.LLAMA3_JSON, '{"name": "get_weather", "parameters": {"city": "Paris"}}', "\nT"),
        (
            ToolFormat.LLAMA3_JSON,
            '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
            "; {B",
        ),
        (
            ToolFormat.MISTRAL,
            '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]',
            "",
        ),
        (ToolFormat.MISTRAL, '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', " a"),
    ],
)
def test_every_format_stops_after_its_call_block(fmt: ToolFormat, call: str, after: str) -> None:
    """`after` is what is generated past the call until it is clear no call follows."""
    reply = call + after + "zz" + SCHEMA_RUN_ON
    assert turn(reply, fmt) == (
        "",
        [("get_weather", {"city": "Paris"})],
        ChatFinish.TOOL_CALLS,
        len(call + after),
    )


def test_qwen3_coder_and_mistral_parallel_calls_both_come_back() -> None:
    oslo = QWEN3.replace("Paris", "Oslo")
    content, calls, finish, _ = turn(f"{QWEN3}\n{oslo}\n", ToolFormat.QWEN3_CODER)
    assert (content, calls, finish) == (
        "",
        [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Oslo"})],
        ChatFinish.TOOL_CALLS,
    )
    text = '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}'
    assert turn(text + "[TOOL_CALLS]get_time[ARGS]{}", ToolFormat.MISTRAL) == (
        "",
        [("get_weather", {"city": "Paris"}), ("get_time", {})],
        ChatFinish.TOOL_CALLS,
        len(text + "[TOOL_CALLS]get_time[ARGS]{}"),
    )


def stream_items(text: str, **kw: bool) -> tuple[list[object], bool]:
    stream = ToolCallStream(ToolFormat.HERMES, TOOLS, **kw)
    out: list[object] = []
    for ch in text:
        out += stream.push(ch)
    out += stream.finish()
    items = [(i.name, json.loads(i.arguments)) if isinstance(i, ToolCall) else i for i in out]
    return items, stream.cut_off


def test_stream_deltas_in_generation_order() -> None:
    items, cut_off = stream_items("On it.\n" + TAGGED + "\n" + TAGGED.replace("Paris", "Oslo"))
    assert items == [
        *list("On it.\n"),
        ("get_weather", {"city": "Paris"}),
        ("get_weather", {"city": "Oslo"}),
    ]
    assert not cut_off


def test_stream_marks_an_unfinished_call_as_cut_off() -> None:
    assert stream_items(TAGGED[:-3]) == ([("get_weather", {"city": "Paris"})], False)
    assert stream_items(TAGGED[:25]) == ([TAGGED[:25]], True)
    assert stream_items(TAGGED + "\n" + TAGGED[:25]) == ([("get_weather", {"city": "Paris"})], True)
