"""Agent-memory episodes, scoring and the command, with fake engines."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kvmem.bench import agent
from kvmem.bench.agent import AgentResult, accuracy, run_agent, table
from kvmem.bench.agent_data import Question, QuestionType, build_episode, is_correct
from kvmem.bench.conversation import Role
from kvmem.bench.engines import Method
from kvmem.bench.main import main
from tests.fakes.bench import FakeFactory


def count(text: str) -> int:
    return len(text)


def memory_answer(visible: str, query: str) -> str:
    """A reader that answers from the last statement it can see before the question."""
    visible = visible.rsplit("<|im_start|>user", 1)[0]
    if "dog" in query and "cat" in query:
        dog = re.findall(r"His name is (\w+)", visible)
        cat = re.findall(r"cat called (\w+)", visible)
        return f" {dog[-1] if dog else '?'} and {cat[-1] if cat else '?'}."
    patterns = {
        "dog's name": r"His name is (\w+)",
        "favorite color": r"favorite color is (\w+)",
        "port": r"port = (\d+)",
        "sister": r"sister (\w+) lives in (\w+)",
        "live in now": r"(?:I live in|moved from \w+ to) (\w+)",
        "car now": r"(?:My car is|It is) (\w+)(?: now|\.)",
    }
    for key, pattern in patterns.items():
        if key in query:
            found = re.findall(pattern, visible)
            if not found:
                return " I do not know."
            last = found[-1]
            return " " + (" in ".join(last) if isinstance(last, tuple) else last) + "."
    return " ?"


def test_episode_plants_facts_early_and_updates_in_the_middle() -> None:
    episode = build_episode(seed=1, target_tokens=6000, count_tokens=count)
    assert episode == build_episode(seed=1, target_tokens=6000, count_tokens=count)
    texts = [m.content for m in episode.history]
    assert episode.history[0].role is Role.SYSTEM
    assert 5800 <= sum(len(t) for t in texts) <= 6600
    by_type = {q.qtype for q in episode.questions}
    assert by_type == set(QuestionType)
    dog = episode.questions[0].expected[0]
    plant = next(i for i, t in enumerate(texts) if f"His name is {dog}." in t)
    move = next(i for i, t in enumerate(texts) if "Big news: I moved from" in t)
    assert plant < len(texts) / 3 < move
    new_city = next(
        q for q in episode.questions if q.text == "Which city do I live in now?"
    ).expected[0]
    assert f"to {new_city} last week" in texts[move]


def test_is_correct_needs_every_expected_string() -> None:
    q = Question(QuestionType.MULTI, "?", "", ("Mochi", "Luna"))
    assert is_correct(" mochi and LUNA.", q)
    assert not is_correct(" Mochi.", q)


def test_run_agent_reuses_the_history_per_episode() -> None:
    factory = FakeFactory(
        {Method.FULL: None, Method.RECENCY: 1500}, sink=100, answer_fn=memory_answer
    )
    results = run_agent(
        factory,
        [Method.FULL, Method.RECENCY, Method.LAST_N],
        seeds=[0, 1],
        target_tokens=5000,
        last_n=800,
        max_tokens=40,
    )
    assert len(results) == 3 * 2 * 7
    full = [r for r in results if r.method is Method.FULL]
    assert all(r.correct for r in full), [
        (r.question, r.answer, r.expected) for r in full if not r.correct
    ]
    # the second and later questions of an episode reuse the history as a cached prefix
    assert [r.cached_tokens > 4000 for r in full] == [False] + [True] * 6 + [False] + [True] * 6
    recency = [r for r in results if r.method is Method.RECENCY]
    assert not all(r.correct for r in recency)
    engines = factory.opened
    assert [e.method for e in engines] == [Method.FULL, Method.RECENCY, Method.FULL]
    assert [e.resets for e in engines] == [2, 2, 2]
    assert all(len(p) <= 800 for p in engines[2].prompts)


def _r(method: Method, qtype: QuestionType, correct: bool) -> AgentResult:
    return AgentResult(
        method, 0, qtype, "q", ("a",), "a" if correct else "", correct, 10, 0, 1.0, 0
    )


def test_accuracy_and_table() -> None:
    results = [
        _r(Method.FULL, QuestionType.SINGLE, True),
        _r(Method.FULL, QuestionType.SINGLE, False),
        _r(Method.FULL, QuestionType.MULTI, True),
        _r(Method.LAST_N, QuestionType.UPDATE, False),
    ]
    assert accuracy(results) == {
        "full": {
            "single": 0.5,
            "multi": 1.0,
            "update": None,
            "all": 2 / 3,
            "correct": 2,
            "total": 3,
        },
        "lastn": {
            "single": None,
            "multi": None,
            "update": 0.0,
            "all": 0.0,
            "correct": 0,
            "total": 1,
        },
    }
    assert table(results).splitlines()[1:] == [
        "method  single   multi  update     all  correct",
        "------  ------  ------  ------  ------  -------",
        "full    0.5000  1.0000       -  0.6667      2/3",
        "lastn        -       -  0.0000  0.0000      0/1",
    ]


def test_command_writes_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    factory = FakeFactory(
        {Method.FULL: None, Method.RETRIEVAL: None, Method.RECENCY: 1200},
        sink=100,
        answer_fn=memory_answer,
    )
    monkeypatch.setattr(agent, "LlamaEngineFactory", lambda settings: factory)
    assert (
        main(
            [
                "agent",
                "--episodes",
                "2",
                "--target-tokens",
                "4000",
                "--max-tokens",
                "40",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    assert "agent memory accuracy" in capsys.readouterr().out
    doc = json.loads((tmp_path / "agent.json").read_text())
    assert doc["command"] == "agent"
    assert set(doc["accuracy"]) == {"full", "retrieval", "recency", "lastn"}
    assert doc["accuracy"]["full"]["all"] == 1.0
    assert len(doc["results"]) == 4 * 2 * 7
    assert set(doc["results"][0]) == {
        "method",
        "episode",
        "qtype",
        "question",
        "expected",
        "answer",
        "correct",
        "prompt_tokens",
        "cached_tokens",
        "prefill_ms",
        "stage_in_blocks",
        "profile",
    }


FORM_PATTERNS = {
    "dog_name": r"His name is (\w+)",
    "favorite_color": r"favorite color is (\w+)",
    "staging_port": r"port = (\d+)",
    "sister": r"sister (\w+) lives in (\w+)",
    "home_city": r"(?:I live in|moved from \w+ to) (\w+)",
    "car_color": r"(?:My car is|It is) (\w+)(?: now|\.)",
}


def form_answer(visible: str, query: str) -> str:
    """A reader for `--final tool`: the field to fill is named in the last tool result."""
    fields = re.findall(r'"field": "(\w+)", "question"', visible)
    if not fields:
        return ' ?"}}'
    field = fields[-1]
    if field == "pet_names":
        dog = re.findall(r"His name is (\w+)", visible)
        cat = re.findall(r"cat called (\w+)", visible)
        return f'{dog[-1] if dog else "?"} and {cat[-1] if cat else "?"}"}}}}'
    found = re.findall(FORM_PATTERNS[field], visible)
    if not found:
        return 'unknown"}}'
    last = found[-1]
    return (", ".join(last) if isinstance(last, tuple) else last) + '"}}'


def test_final_tool_messages_end_in_the_form_field() -> None:
    from kvmem.bench.agent_final_tool import TASK, final_tool_messages

    question = build_episode(0, 3000, count).questions[0]
    messages, prefix = final_tool_messages(question)
    assert [m.role for m in messages] == [
        Role.USER,
        Role.ASSISTANT,
        Role.TOOL,
        Role.ASSISTANT,
        Role.TOOL,
    ]
    assert messages[0].content == TASK
    assert [m.tool_calls[0].name for m in messages[1::2]] == ["open_form", "next_field"]
    assert [m.tool_call_id for m in messages[2::2]] == ["form_0", "form_1"]
    assert json.loads(messages[-1].content) == {
        "field": "dog_name",
        "question": "What is the name of the user's dog?",
    }
    assert prefix == (
        '<tool_call>\n{"name": "fill_field", "arguments": {"field": "dog_name", "value": "'
    )
    assert all(q.form_field and q.form_label for q in build_episode(0, 3000, count).questions)


def test_run_agent_with_the_question_as_the_final_tool_result() -> None:
    factory = FakeFactory(
        {Method.FULL: None, Method.RECENCY: 1500}, sink=100, answer_fn=form_answer
    )
    results = run_agent(
        factory, [Method.FULL, Method.RECENCY], [0], 5000, 800, max_tokens=40, final="tool"
    )
    full = [r for r in results if r.method is Method.FULL]
    assert [r.correct for r in full] == [True] * 7, [(r.answer, r.expected) for r in full]
    assert not all(r.correct for r in results if r.method is Method.RECENCY)
    prompts = factory.opened[0].prompts
    tail = factory.opened[0].detokenize(prompts[0][-200:])
    assert tail.endswith(
        '<|im_start|>assistant\n<tool_call>\n{"name": "fill_field", "arguments": '
        '{"field": "dog_name", "value": "'
    )
    assert '<|im_start|>tool\n{"field": "dog_name", "question": ' in tail
    # the task, its first round and the next_field call are shared by every question
    assert all(r.cached_tokens > 5000 for r in full[1:])
    assert all(len(p) > 5200 for p in prompts)


def test_command_rejects_an_unknown_final(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["agent", "--final", "assistant"])
    assert "argument --final: invalid choice: 'assistant'" in capsys.readouterr().err
