"""The Responses and Anthropic event builders on scripted turn events, and the response store."""

from __future__ import annotations

from kvmem.chat.reasoning import Channel
from kvmem.chat.tool_calls import ToolCall
from kvmem.chat.turn import ChatFinish, TextDelta, ToolCallEvent, TurnDone, TurnUsage
from kvmem.server.anthropic_events import MessageBuilder
from kvmem.server.response_store import ResponseStore
from kvmem.server.responses_events import ResponseBuilder

USAGE = TurnUsage(prompt_tokens=50, cached_tokens=30, completion_tokens=7, reasoning_tokens=2)
CALL = ToolCall("get", '{"city": "Paris"}', id="call_abc")
TURN = [
    TextDelta(Channel.REASONING, "think"),
    TextDelta(Channel.REASONING, "ing"),
    TextDelta(Channel.CONTENT, "Hel"),
    TextDelta(Channel.CONTENT, "lo"),
    ToolCallEvent(0, CALL),
    TextDelta(Channel.CONTENT, "\n"),
    ToolCallEvent(1, ToolCall("get", "{}", id="call_def")),
    TurnDone(ChatFinish.TOOL_CALLS, USAGE),
]


def _strip_ids(value: object) -> object:
    if isinstance(value, dict):
        return {k: ("ID" if k in ("id", "item_id") else _strip_ids(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [_strip_ids(v) for v in value]
    return value


def test_response_builder_event_sequence_and_final_object() -> None:
    builder = ResponseBuilder("smol", {"store": True})
    events = builder.start()
    for event in TURN:
        events += builder.push(event)
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e.get("output_index") for e in events[2:-1]] == [0] * 7 + [1] * 7 + [2] * 4 + [3] * 4
    assert _strip_ids(events[18]) == {
        "type": "response.function_call_arguments.done",
        "sequence_number": 18,
        "item_id": "ID",
        "output_index": 2,
        "name": "get",
        "arguments": '{"city": "Paris"}',
    }
    body = builder.response()
    assert _strip_ids(body["output"]) == [
        {
            "id": "ID",
            "type": "reasoning",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "thinking"}],
            "status": "completed",
        },
        {
            "id": "ID",
            "type": "message",
            "role": "assistant",
            "content": [
                {"type": "output_text", "text": "Hello", "annotations": [], "logprobs": []}
            ],
            "status": "completed",
        },
        {
            "id": "ID",
            "type": "function_call",
            "call_id": "call_abc",
            "name": "get",
            "arguments": '{"city": "Paris"}',
            "status": "completed",
        },
        {
            "id": "ID",
            "type": "function_call",
            "call_id": "call_def",
            "name": "get",
            "arguments": "{}",
            "status": "completed",
        },
    ]
    assert body["status"] == "completed" and body["store"] is True
    assert body["usage"] == {
        "input_tokens": 50,
        "input_tokens_details": {"cached_tokens": 30, "cache_write_tokens": 0},
        "output_tokens": 7,
        "output_tokens_details": {"reasoning_tokens": 2},
        "total_tokens": 57,
    }
    assert events[-1]["response"] == body
    assert builder.output_parts() == (
        "Hello",
        "thinking",
        [("call_abc", "get", '{"city": "Paris"}'), ("call_def", "get", "{}")],
    )


def test_response_builder_length_is_incomplete() -> None:
    builder = ResponseBuilder("smol", {})
    builder.push(TextDelta(Channel.CONTENT, "abc"))
    events = builder.push(TurnDone(ChatFinish.LENGTH, USAGE))
    assert [e["type"] for e in events][-1] == "response.incomplete"
    body = builder.response()
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["output"][0]["status"] == "incomplete"


def test_response_builder_whitespace_only_answer_is_kept() -> None:
    builder = ResponseBuilder("smol", {})
    assert builder.push(TextDelta(Channel.CONTENT, " ")) == []
    builder.push(TurnDone(ChatFinish.STOP, USAGE))
    assert builder.output_parts() == (" ", "", [])


def test_message_builder_stream_and_message() -> None:
    builder = MessageBuilder("smol", prompt_tokens=50)
    events = builder.start()
    for event in TURN:
        events += builder.push(event)
    assert events[0]["message"]["usage"] == {
        "input_tokens": 50,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": 0,
    }
    assert [(e["type"], e.get("index")) for e in events] == [
        ("message_start", None),
        ("ping", None),
        ("content_block_start", 0),
        ("content_block_delta", 0),
        ("content_block_delta", 0),
        ("content_block_stop", 0),
        ("content_block_start", 1),
        ("content_block_delta", 1),
        ("content_block_delta", 1),
        ("content_block_stop", 1),
        ("content_block_start", 2),
        ("content_block_delta", 2),
        ("content_block_stop", 2),
        ("content_block_start", 3),
        ("content_block_delta", 3),
        ("content_block_stop", 3),
        ("message_delta", None),
        ("message_stop", None),
    ]
    assert events[2]["content_block"] == {"type": "thinking", "thinking": "", "signature": ""}
    assert events[3]["delta"] == {"type": "thinking_delta", "thinking": "think"}
    assert events[7]["delta"] == {"type": "text_delta", "text": "Hel"}
    assert events[10]["content_block"] == {
        "type": "tool_use",
        "id": "toolu_abc",
        "name": "get",
        "input": {},
    }
    assert events[11]["delta"] == {"type": "input_json_delta", "partial_json": '{"city": "Paris"}'}
    assert events[16] == {
        "type": "message_delta",
        "delta": {"stop_reason": "tool_use", "stop_sequence": None},
        "usage": {
            "input_tokens": 20,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 30,
            "output_tokens": 7,
        },
    }
    message = builder.message()
    assert message["content"] == [
        {"type": "thinking", "thinking": "thinking", "signature": ""},
        {"type": "text", "text": "Hello"},
        {"type": "tool_use", "id": "toolu_abc", "name": "get", "input": {"city": "Paris"}},
        {"type": "tool_use", "id": "toolu_def", "name": "get", "input": {}},
    ]
    assert (message["stop_reason"], message["stop_sequence"]) == ("tool_use", None)


def test_message_builder_stop_reasons() -> None:
    cases = [
        (TurnDone(ChatFinish.STOP, USAGE), ("end_turn", None)),
        (TurnDone(ChatFinish.STOP, USAGE, "END"), ("stop_sequence", "END")),
        (TurnDone(ChatFinish.LENGTH, USAGE), ("max_tokens", None)),
    ]
    for done, expected in cases:
        builder = MessageBuilder("smol")
        builder.push(TextDelta(Channel.CONTENT, "x"))
        builder.push(done)
        message = builder.message()
        assert (message["stop_reason"], message["stop_sequence"]) == expected
        assert message["content"] == [{"type": "text", "text": "x"}]


def test_response_store_is_bounded() -> None:
    store = ResponseStore(max_responses=2, max_chars=10_000)
    for i in range(3):
        store.put({"id": f"r{i}"}, [{"role": "user", "content": str(i)}])
    assert len(store) == 2 and store.get("r0") is None
    assert store.get("r1") is not None  # now the most recent
    store.put({"id": "r3"}, [])
    assert store.get("r2") is None and store.get("r1") is not None
    store.put({"id": "big"}, [{"role": "user", "content": "x" * 20_000}])
    assert store.get("big") is None  # larger than the whole store: not kept
    assert store.delete("r1") and not store.delete("r1")
