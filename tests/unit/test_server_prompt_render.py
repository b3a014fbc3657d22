"""The server renders a chat request's template once (n > 1 choices and tools included)
and reports prompts whose spans it could not find in /props and to the engine."""

from __future__ import annotations

from fastapi.testclient import TestClient

from kvmem.memory.spans import PromptSpans, TokenSpan
from kvmem.server.app import create_app
from tests.fakes.app import settings, wait_ready
from tests.fakes.engine import FakeEngine

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]
AGENT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Fix the bug in parser.py.\n"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "read_file", "arguments": '{"path": "parser.py"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "def parse(): pass"},
]


def test_n_choices_with_tools_render_once_and_share_the_spans() -> None:
    engine = FakeEngine(replies=["one", "two", "three"])
    app = create_app(settings(chat_template="llama3"), lambda _: engine)
    with TestClient(app) as c:
        wait_ready(c)
        before = c.get("/props").json()["kvmem"]["prompt_spans"]
        body = {"messages": AGENT, "tools": TOOLS, "n": 3, "max_tokens": 8}
        r = c.post("/v1/chat/completions", json=body)
        assert r.status_code == 200
        assert [ch["message"]["content"] for ch in r.json()["choices"]] == ["one", "two", "three"]
        after = c.get("/props").json()["kvmem"]["prompt_spans"]
    assert before == {"renders": 0, "unlocated": {}}
    assert after == {"renders": 1, "unlocated": {}}
    assert len(engine.calls) == 3 and len({call.prompt for call in engine.calls}) == 1
    spans = engine.calls[0].query
    assert isinstance(spans, PromptSpans) and spans.unlocated == ()
    assert spans.query is not None and spans.trajectory is not None
    text = engine.calls[0].prompt  # one token per character
    assert text[spans.query.start : spans.query.end] == "Fix the bug in parser.py."
    assert all(call.query == spans for call in engine.calls)
    assert spans.trajectory == TokenSpan(spans.query.end, len(text))


def test_a_prompt_whose_query_is_not_found_is_counted_and_passed_on() -> None:
    engine = FakeEngine(replies=["ok"])
    dropping = "{% for m in messages %}<{{ m.role }}>{% endfor %}<assistant>"
    with TestClient(create_app(settings(chat_template=dropping), lambda _: engine)) as c:
        wait_ready(c)
        messages = [{"role": "user", "content": "where is the task?"}]
        assert c.post("/v1/chat/completions", json={"messages": messages}).status_code == 200
        props = c.get("/props").json()["kvmem"]["prompt_spans"]
    assert props == {"renders": 1, "unlocated": {"query": 1, "control": 1, "live": 1}}
    spans = engine.calls[0].query
    assert isinstance(spans, PromptSpans) and spans.query is None
    assert spans.unlocated == ("query", "control", "live")
