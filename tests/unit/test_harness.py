"""Agent harnesses recognised by their request shape; their control text pinned or a 413."""

from __future__ import annotations

import pytest

from kvmem.chat.harness import Harness, harness_shape, pinned_parts, recognise
from kvmem.chat.message_spans import CharSpan
from kvmem.chat.prompt import PromptTokens, RenderedPrompt
from kvmem.config import HarnessOverflow, KVMemConfig
from kvmem.errors import PinnedTooLargeError
from kvmem.memory.planner import PlannerConfig, Tier, WindowRequest, plan_window
from kvmem.memory.spans import PromptSpans, TokenSpan
from kvmem.server.harness_pins import pin_harness
from tests.unit.harness_bodies import (
    CLAUDE_TOOLS,
    CODEX_TOOLS,
    claude_code,
    claude_md,
    codex,
    opencode,
    tool,
)

RULE = "Run the tests with make check."


@pytest.mark.parametrize(
    ("body", "harness", "name", "block"),
    [
        (claude_code(RULE, "Fix the bug."), Harness.CLAUDE_CODE, "CLAUDE.md reminder", "<system-reminder>"),
        (opencode(RULE, "Fix the bug."), Harness.OPENCODE, "AGENTS.md reminder", "<system-reminder>"),
        (codex(RULE, "Fix the bug."), Harness.CODEX, "AGENTS.md reminder", "# AGENTS.md instructions"),
    ],
)  # fmt: skip
def test_each_harness_and_its_reminder_are_recognised(
    body: dict, harness: Harness, name: str, block: str
) -> None:
    shape = harness_shape(body["messages"], body["tools"])
    assert shape is not None and shape.harness is harness
    assert [r.name for r in shape.reminders] == [name]
    assert shape.reminders[0].text.startswith(block) and RULE in shape.reminders[0].text


def test_tool_sets_recognise_without_the_system_marker() -> None:
    plain = [{"role": "system", "content": "Be helpful."}, {"role": "user", "content": "hi"}]
    assert recognise(plain, CLAUDE_TOOLS) is Harness.CLAUDE_CODE
    assert recognise(plain, CODEX_TOOLS) is Harness.CODEX
    assert recognise(plain, [tool("apply_patch"), tool("update_plan")]) is None  # no shell
    assert recognise(plain, [tool("Bash"), tool("Read"), tool("Edit")]) is None  # three of seven


def test_a_generic_client_gets_no_pins_even_with_a_reminder_lookalike() -> None:
    messages = [{"role": "user", "content": claude_md(RULE)}]
    assert harness_shape(messages, [tool("get_weather")]) is None


def test_a_repeated_reminder_is_pinned_once_at_its_latest_occurrence() -> None:
    body = claude_code(RULE, "First task.")
    body["messages"] += [
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": f"{claude_md(RULE)}\nSecond task."},
        {"role": "user", "content": claude_md("Use tabs.")},
    ]
    shape = harness_shape(body["messages"], body["tools"])
    assert shape is not None
    assert [RULE in r.text for r in shape.reminders] == [True, False]
    text = "SYSTEM|" + claude_md(RULE) + "First|" + claude_md(RULE) + "Second|"
    text += claude_md("Use tabs.")
    parts = pinned_parts(text, 6, shape)
    latest = text.rfind(claude_md(RULE))
    assert [p.name for p in parts] == [
        "system prompt and tools",
        "CLAUDE.md reminder",
        "CLAUDE.md reminder",
    ]
    assert parts[0].chars == CharSpan(0, 6)
    assert parts[1].chars == CharSpan(latest, latest + len(claude_md(RULE)))


def test_the_pinned_tier_holds_every_pinned_block_past_the_control_bound() -> None:
    config = PlannerConfig(block_tokens=4, budget_tokens=40, sink_blocks=1, recent_blocks=2,
                           control_tokens=4, query_tokens=4, trajectory_tokens=4)  # fmt: skip
    spans = PromptSpans(control=TokenSpan(0, 16), pinned=(TokenSpan(0, 16), TokenSpan(40, 48)))
    request = WindowRequest(n_complete=30, open_tokens=1, spans=spans)
    plan = plan_window(config, request, on_gpu=[], scores=None)
    assert plan.tier(Tier.PINNED) == (1, 2, 3, 10, 11)
    assert set(plan.tier(Tier.PINNED)) <= set(plan.selected)
    assert plan.tier(Tier.SINK) == (0,) and plan.tier(Tier.RECENT) == (28, 29)


def _rendered(text: str, control_end: int) -> RenderedPrompt:
    return RenderedPrompt(
        text=text, query_chars=None, opens_reasoning=False, control_end=control_end
    )


def test_an_oversized_pinned_set_is_a_413_naming_its_parts() -> None:
    body = claude_code(RULE, "Fix it.")
    kv = KVMemConfig(budget=640, gen_reserve=128)
    text = "S" * 100 + claude_md(RULE) + "Fix it."
    rendered = _rendered(text, 100)
    limit = pin_harness(rendered, body["messages"], body["tools"], kv)
    assert limit is not None and limit.harness == "claude-code"
    assert [p.name for p in rendered.pinned] == ["system prompt and tools", "CLAUDE.md reminder"]
    fits = PromptSpans(pinned=(TokenSpan(0, 100), TokenSpan(100, 140)))
    limit.check(_tokens(fits))  # blocks 0 and 1 + 2 recent + the open one = 640 tokens: fits
    over = PromptSpans(pinned=(TokenSpan(0, 300), TokenSpan(300, 340)))
    with pytest.raises(PinnedTooLargeError) as caught:
        limit.check(_tokens(over))
    assert str(caught.value).startswith(
        "the claude-code request's pinned control text needs 768 tokens of the GPU window "
        "(system prompt and tools: 300 tokens, CLAUDE.md reminder: 40 tokens;"
    )
    assert "KVMem budget is 640 tokens" in str(caught.value)


def test_fallback_and_other_clients_pin_nothing() -> None:
    body = claude_code(RULE, "Fix it.")
    fallback = KVMemConfig(harness_overflow=HarnessOverflow.FALLBACK)
    rendered = _rendered("x" * 50, 10)
    assert pin_harness(rendered, body["messages"], body["tools"], fallback) is None
    assert rendered.pinned == ()
    plain = [{"role": "user", "content": "hi"}]
    assert pin_harness(rendered, plain, [], KVMemConfig()) is None


def _tokens(spans: PromptSpans) -> PromptTokens:
    prompt = PromptTokens(tokens=[], query=None, spans=spans)
    prompt.pinned_names = ("system prompt and tools", "CLAUDE.md reminder")
    return prompt
