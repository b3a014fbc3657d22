"""The agent-loop needle layout and the oracle (`--oracle`), with fake engines.

The agent layout's last user message is the task at the start and its final message is
a tool result; the oracle forces the needle's token span into the window of KVMem methods.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kvmem.bench import needle
from kvmem.bench.conversation import ChatMLRenderer, Role
from kvmem.bench.engines import Method
from kvmem.bench.main import main
from kvmem.bench.needle import run_needle
from kvmem.bench.needle_agent import SYSTEM_PROMPT, TOOLS
from kvmem.bench.needle_data import Layout, NeedleKind, NeedleSpec, build_case, needle_sentence
from kvmem.bench.oracle import forced_spans
from kvmem.errors import ConfigError
from kvmem.memory.spans import TokenSpan
from tests.fakes.bench import CharTokenizer, FakeEngine, FakeFactory

TOK = CharTokenizer()


def count(text: str) -> int:
    return len(text)


def agent_spec(depth: float, kind: NeedleKind = NeedleKind.PASSKEY, length: int = 3000):
    return NeedleSpec(kind, Layout.AGENT, length, depth, 0)


def agent_answer(visible: str, query: str) -> str:
    """A perfect reader of the agent loop: the locked vault is named in the last result."""
    locked = re.findall(r"error: the (\w+) vault is locked", visible)
    if not locked:
        return 'none"}}'
    vault = locked[-1]
    pattern = (
        r"The pass key is (\d+)"
        if vault == "deploy"
        else rf"pass key for the {vault} vault is (\d+)"
    )
    found = re.search(pattern, visible)
    return f'{found.group(1)}"}}}}' if found else 'unknown"}}'


def test_agent_case_is_a_tool_loop_that_ends_in_a_tool_result() -> None:
    case = build_case(agent_spec(0.5), count)
    assert case == build_case(agent_spec(0.5), count)  # deterministic
    roles = [m.role for m in case.messages]
    assert roles[:2] == [Role.SYSTEM, Role.USER] and roles.count(Role.USER) == 1
    assert roles[2:] == [Role.ASSISTANT, Role.TOOL] * ((len(roles) - 2) // 2)
    assert case.messages[0].content == SYSTEM_PROMPT and case.tools == TOOLS
    assert case.messages[1].content.startswith("The nightly deploy failed.")
    for call_msg, result in zip(case.messages[2::2], case.messages[3::2], strict=True):
        assert call_msg.content == "" and len(call_msg.tool_calls) == 1
        call = call_msg.tool_calls[0]
        assert result.tool_call_id == call.id
        assert call.name in {"run_command", "query_db", "read_file"}
        assert len(json.loads(call.arguments)) == 1
    last_call = case.messages[-2].tool_calls[0]
    assert (last_call.name, json.loads(last_call.arguments)) == (
        "run_command",
        {"command": "./deploy.sh --resume"},
    )
    assert case.messages[-1].content == (
        "deploy.sh: resuming at step 4/4 (unlock)\n"
        "error: the deploy vault is locked\n"
        "hint: call unlock_vault with the pass key from the earlier tool results"
    )
    assert case.answer_prefix == (
        '<tool_call>\n{"name": "unlock_vault", "arguments": {"vault": "deploy", "pass_key": "'
    )
    assert case.needle == needle_sentence(case.expected, None)
    holders = [m for m in case.messages if case.needle in m.content]
    assert len(holders) == 1 and holders[0].role is Role.TOOL
    assert case.needle in holders[0].content.split("\n")  # one line of the result


def test_agent_depth_runs_from_the_first_result_to_the_last_before_the_final_round() -> None:
    first = build_case(agent_spec(0.0), count)
    last = build_case(agent_spec(1.0), count)
    assert first.messages[3].content.startswith(first.needle + "\n")
    assert last.messages[-3].content.endswith("\n" + last.needle)

    def strip(case: Any) -> list[str]:
        return [
            m.content.replace(case.needle + "\n", "").replace("\n" + case.needle, "")
            for m in case.messages
        ]

    assert strip(first) == strip(last)  # one haystack for every depth


def test_multikey_agent_case_asks_for_the_locked_vault() -> None:
    case = build_case(agent_spec(0.3, NeedleKind.MULTIKEY), count)
    vault = re.search(r"error: the (\w+) vault is locked", case.messages[-1].content).group(1)
    assert case.needle == needle_sentence(case.expected, vault)
    assert case.messages[-1].content.endswith(
        f"call unlock_vault with the pass key of the {vault} vault from the earlier tool results"
    )
    assert case.answer_prefix.endswith(f'{{"vault": "{vault}", "pass_key": "')
    text = "\n".join(m.content for m in case.messages)
    assert len(re.findall(r"The pass key for the \w+ vault is \d+\.", text)) == 4


@pytest.mark.parametrize("length", [2000, 6000])
def test_agent_case_lands_near_its_length(length: int) -> None:
    case = build_case(agent_spec(0.5, length=length), count)
    prompt = ChatMLRenderer(TOK).render(
        case.messages, answer_prefix=case.answer_prefix, tools=case.tools
    )
    assert abs(len(prompt.tokens) - length) < 0.06 * length


def test_chatml_renders_tool_calls_tools_and_the_prefix_with_special_tokens() -> None:
    case = build_case(agent_spec(0.5, length=2000), count)
    prompt = ChatMLRenderer(TOK).render(
        case.messages, answer_prefix=case.answer_prefix, tools=case.tools
    )
    text = TOK.detokenize(prompt.tokens)
    assert text.startswith(f"<|im_start|>system\n{SYSTEM_PROMPT}\n\n# Tools\n<tools>\n")
    assert json.dumps(TOOLS[3]) + "\n</tools><|im_end|>\n" in text
    call = case.messages[2].tool_calls[0]
    assert (
        f'<|im_start|>assistant\n<tool_call>\n{{"name": "{call.name}", "arguments": '
        f"{call.arguments}}}\n</tool_call><|im_end|>\n<|im_start|>tool\n"
    ) in text
    assert text.endswith("<|im_start|>assistant\n" + case.answer_prefix)
    assert prompt.query is not None
    assert TOK.detokenize(prompt.tokens[prompt.query.start : prompt.query.end]) == (
        case.messages[1].content
    )


@pytest.mark.parametrize("layout", list(Layout))
@pytest.mark.parametrize("depth", [0.0, 0.4, 1.0])
def test_needle_span_is_exactly_the_needle_tokens(layout: Layout, depth: float) -> None:
    case = build_case(NeedleSpec(NeedleKind.MULTIKEY, layout, 2500, depth, 1), count)
    renderer = ChatMLRenderer(TOK)
    prompt = renderer.render(case.messages, answer_prefix=case.answer_prefix, tools=case.tools)
    span = renderer.span_of(case.messages, prompt, case.needle, case.tools)
    assert span is not None
    assert TOK.detokenize(prompt.tokens[span.start : span.end]) == case.needle
    assert renderer.span_of(case.messages, prompt, "no such text", case.tools) is None


@dataclass
class OracleSession:
    """A session with the oracle hook; records the spans in force at each generate."""

    force_spans: tuple[TokenSpan, ...] = ()
    seen: list[tuple[TokenSpan, ...]] = field(default_factory=list)


class OracleEngine(FakeEngine):
    """A windowed fake that also sees the tokens of the spans its session forces."""

    def visible(self, prompt):  # type: ignore[override]
        self.session.seen.append(self.session.force_spans)
        shown = super().visible(prompt)
        forced = [t for s in self.session.force_spans for t in prompt[s.start : s.end]]
        return forced + shown


@dataclass
class OracleFactory(FakeFactory):
    def open(self, method: Method) -> FakeEngine:
        engine = OracleEngine(method, self.answer_fn, self.window_of.get(method), self.sink)
        engine.session = OracleSession()
        self.opened.append(engine)
        return engine


@pytest.mark.parametrize("layout", [Layout.AGENT, Layout.TOOLS, Layout.RAW])
def test_oracle_forces_the_needle_for_kvmem_methods_only(layout: Layout) -> None:
    specs = [NeedleSpec(NeedleKind.PASSKEY, layout, 3000, d, 0) for d in (0.5, 1.0)]
    answer = agent_answer if layout is Layout.AGENT else FakeFactory.answer_fn
    windows = {Method.FULL: None, Method.RECENCY: 700}
    plain = run_needle(
        OracleFactory(windows, sink=200, answer_fn=answer),
        [Method.RECENCY],
        specs,
        last_n=600,
        max_tokens=12,
    )
    assert [r.correct for r in plain] == [False, True]  # the recent window holds depth 1 only
    factory = OracleFactory(windows, sink=200, answer_fn=answer)
    forced = run_needle(
        factory, [Method.FULL, Method.RECENCY], specs, last_n=600, max_tokens=12, oracle=True
    )
    assert [(r.method, r.correct, r.oracle) for r in forced] == [
        (Method.FULL, True, False),
        (Method.FULL, True, False),
        (Method.RECENCY, True, True),
        (Method.RECENCY, True, True),
    ]
    full, recency = factory.opened
    assert full.session.seen == [(), ()]
    spans = [TokenSpan(*r.needle_span) for r in forced[2:]]
    assert recency.session.seen == [(spans[0],), (spans[1],)]
    assert recency.session.force_spans == ()  # reset after the last case
    assert forced[0].needle_span == forced[2].needle_span


def test_oracle_is_refused_without_the_session_hook() -> None:
    specs = [NeedleSpec(NeedleKind.PASSKEY, Layout.AGENT, 2000, 0.5, 0)]
    factory = FakeFactory({Method.RETRIEVAL: 500}, answer_fn=agent_answer)
    with pytest.raises(ConfigError) as info:
        run_needle(factory, [Method.RETRIEVAL], specs, last_n=600, max_tokens=12, oracle=True)
    assert str(info.value) == (
        "--oracle: this engine's KVMem session has no force_spans hook, so the needle's "
        "blocks cannot be forced into the window"
    )
    assert factory.opened[0].prompts == []


def test_forced_spans_resets_the_hook_when_the_turn_fails() -> None:
    engine = OracleEngine(Method.RETRIEVAL)
    engine.session = OracleSession()
    span = TokenSpan(10, 20)
    with pytest.raises(RuntimeError), forced_spans(engine, (span,)):
        assert engine.session.force_spans == (span,)
        raise RuntimeError("decode failed")
    assert engine.session.force_spans == ()


def test_command_runs_the_agent_layout_with_the_oracle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    factory = OracleFactory(
        {Method.FULL: None, Method.RETRIEVAL: 600, Method.RECENCY: 600},
        sink=200,
        answer_fn=agent_answer,
    )
    monkeypatch.setattr(needle, "LlamaEngineFactory", lambda settings: factory)
    args = ["needle", "--layouts", "agent", "--kinds", "passkey,multikey", "--lengths", "2500"]
    rc = main([*args, "--depths", "3", "--seeds", "1", "--oracle", "--out", str(tmp_path)])
    assert rc == 0
    assert "needle multikey, agent layout, ~2500 tokens" in capsys.readouterr().out
    doc = json.loads((tmp_path / "needle.json").read_text())
    assert doc["settings"]["oracle"] is True
    assert [doc["summary"][m]["accuracy"] for m in ("full", "retrieval", "recency")] == [1.0] * 3
    assert {c["layout"] for c in doc["cases"]} == {"agent"}
    assert all(c["oracle"] is (c["method"] != "full") for c in doc["cases"])
