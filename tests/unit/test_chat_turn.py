"""run_turn: detokenize -> stop -> thinking -> tools, segments for budget and grammar."""

from __future__ import annotations

import json
import threading

from kvmem.chat.prompt import PromptTokens
from kvmem.chat.reasoning import THINK_TAGS, Channel
from kvmem.chat.tool_calls import ToolFormat
from kvmem.chat.turn import ChatFinish, TextDelta, ToolCallEvent, TurnDone, TurnRequest, run_turn
from kvmem.memory.spans import TokenSpan
from tests.fakes.engine import FakeEngine


def prompt(text: str, *, opens_reasoning: bool = False) -> PromptTokens:
    return PromptTokens([ord(c) for c in text], TokenSpan(0, 1), text, opens_reasoning)


def collect(
    engine: FakeEngine, req: TurnRequest
) -> tuple[dict[str, str], list[tuple[str, dict]], TurnDone]:
    text = {"content": "", "reasoning_content": ""}
    calls = []
    events = list(run_turn(engine, req))
    for ev in events[:-1]:
        if isinstance(ev, TextDelta):
            text[ev.channel.value] += ev.text
        else:
            assert isinstance(ev, ToolCallEvent)
            calls.append((ev.call.name, json.loads(ev.call.arguments)))
    done = events[-1]
    assert isinstance(done, TurnDone)
    return text, calls, done


def test_plain_answer_with_stop_string_and_exact_usage() -> None:
    engine = FakeEngine(replies=["Hello world. END more"])
    text, calls, done = collect(engine, TurnRequest(prompt=prompt("Q:"), stop=("END",)))
    assert text == {"content": "Hello world. ", "reasoning_content": ""}
    assert calls == []
    assert done.finish_reason is ChatFinish.STOP
    assert (done.usage.prompt_tokens, done.usage.cached_tokens, done.usage.completion_tokens) == (
        2,
        0,
        16,
    )
    assert engine.calls[0].query == TokenSpan(0, 1)


def test_max_tokens_gives_length() -> None:
    engine = FakeEngine(replies=["abcdefgh"])
    text, _, done = collect(engine, TurnRequest(prompt=prompt("Q"), max_tokens=5))
    assert text["content"] == "abcde"
    assert done.finish_reason is ChatFinish.LENGTH
    assert engine.calls[0].max_tokens == 5


def test_thinking_budget_closes_the_block_and_continues_from_the_cached_history() -> None:
    engine = FakeEngine(replies=["abcdefghij", "Answer."])
    req = TurnRequest(
        prompt=prompt("P", opens_reasoning=True),
        reasoning=THINK_TAGS,
        reasoning_budget=3,
        budget_message="(out of budget)",
    )
    text, _, done = collect(engine, req)
    assert text == {"reasoning_content": "abc(out of budget)\n", "content": "Answer."}
    forced = "(out of budget)\n</think>\n\n"
    assert [c.prompt for c in engine.calls] == ["P", "Pabc" + forced]
    assert engine.last_turn.cached_tokens == 4  # the prompt and the three thinking tokens
    assert done.usage.cached_tokens == 0  # from the first segment
    assert done.usage.completion_tokens == 3 + len(forced) + len("Answer.")
    assert done.usage.reasoning_tokens == 3
    assert done.finish_reason is ChatFinish.STOP


def test_zero_budget_closes_thinking_before_generating() -> None:
    engine = FakeEngine(replies=["Direct answer."])
    req = TurnRequest(
        prompt=prompt("P", opens_reasoning=True), reasoning=THINK_TAGS, reasoning_budget=0
    )
    text, _, _ = collect(engine, req)
    assert text == {"reasoning_content": "", "content": "Direct answer."}
    assert engine.calls[0].prompt == "P\n</think>\n\n"


def test_grammar_waits_until_thinking_ends() -> None:
    engine = FakeEngine(replies=["plan</think>ignored", '{"a": 1}'])
    req = TurnRequest(
        prompt=prompt("P", opens_reasoning=True), reasoning=THINK_TAGS, grammar="root ::= x"
    )
    text, _, done = collect(engine, req)
    assert [c.grammar for c in engine.calls] == [None, "root ::= x"]
    assert engine.calls[1].prompt == "Pplan</think>"
    assert text == {"reasoning_content": "plan", "content": '{"a": 1}'}
    assert done.finish_reason is ChatFinish.STOP


def test_tool_calls_are_parsed_from_the_stream() -> None:
    reply = 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    engine = FakeEngine(replies=[reply])
    req = TurnRequest(prompt=prompt("Q"), tool_format=ToolFormat.HERMES, tools=[])
    text, calls, done = collect(engine, req)
    assert text["content"] == "Let me look.\n"
    assert calls == [("get_weather", {"city": "Paris"})]
    assert done.finish_reason is ChatFinish.TOOL_CALLS


def test_unparseable_tool_call_becomes_content() -> None:
    reply = "<tool_call>\nnot json\n</tool_call>"
    engine = FakeEngine(replies=[reply])
    text, calls, done = collect(
        engine, TurnRequest(prompt=prompt("Q"), tool_format=ToolFormat.HERMES)
    )
    assert text["content"] == reply
    assert calls == []
    assert done.finish_reason is ChatFinish.STOP


def test_cancel_before_start() -> None:
    cancel = threading.Event()
    cancel.set()
    engine = FakeEngine(replies=["never"])
    text, _, done = collect(engine, TurnRequest(prompt=prompt("Q"), cancel=cancel))
    assert text["content"] == ""
    assert done.finish_reason is ChatFinish.CANCELLED
    assert engine.calls == []


def test_reasoning_deltas_stream_on_their_channel() -> None:
    engine = FakeEngine(replies=["<think>\nhm</think>\n\nok"])
    events = list(run_turn(engine, TurnRequest(prompt=prompt("Q"), reasoning=THINK_TAGS)))
    channels = [(e.channel, e.text) for e in events if isinstance(e, TextDelta)]
    assert channels == [
        (Channel.REASONING, "h"),
        (Channel.REASONING, "m"),
        (Channel.CONTENT, "o"),
        (Channel.CONTENT, "k"),
    ]
