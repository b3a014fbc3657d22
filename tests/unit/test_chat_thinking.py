"""Thinking controls change the rendered prompt exactly as specified."""

from __future__ import annotations

import pytest

from kvmem.chat.messages import normalize_messages
from kvmem.chat.prompt import render_prompt
from kvmem.chat.template import ChatTemplate
from kvmem.chat.thinking import ThinkingDefaults, resolve_thinking
from kvmem.errors import InvalidRequestError

# A Qwen3-style thinking template: effort instructions, <think> opened by the generation
# prompt, an empty closed block when enable_thinking is false.
THINKING_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if reasoning_effort is defined and reasoning_effort == 'low' %}{{ '/brief\\n' }}"
    "{% elif reasoning_effort is defined and reasoning_effort in ('high', 'xhigh') %}{{ '/careful\\n' }}{% endif %}"
    "{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}"
    "{% else %}{{ '<think>\\n' }}{% endif %}"
    "{% endif %}"
)
HEAD = "<|im_start|>user\nWhat is 19 x 23?<|im_end|>\n<|im_start|>assistant\n"
OPEN = HEAD + "<think>\n"
CLOSED = HEAD + "<think>\n\n</think>\n\n"

TEMPLATE = ChatTemplate(THINKING_TEMPLATE)
MESSAGES = normalize_messages([{"role": "user", "content": "What is 19 x 23?"}])


def rendered(defaults: ThinkingDefaults, **request: object) -> str:
    plan = resolve_thinking(defaults, **request)  # type: ignore[arg-type]
    return render_prompt(TEMPLATE, MESSAGES, template_kwargs=plan.template_kwargs).text


@pytest.mark.parametrize(
    ("defaults", "request_fields", "expected"),
    [
        (ThinkingDefaults(), {}, OPEN),
        (ThinkingDefaults(), {"reasoning_effort": "none"}, CLOSED),
        (ThinkingDefaults(), {"reasoning_effort": "low"}, HEAD + "/brief\n<think>\n"),
        (ThinkingDefaults(), {"reasoning_effort": "medium"}, OPEN),
        (ThinkingDefaults(reasoning_effort="high"), {}, HEAD + "/careful\n<think>\n"),
        (ThinkingDefaults(reasoning_effort="high"), {"reasoning_effort": "default"}, OPEN),
        (
            ThinkingDefaults(reasoning_effort="high"),
            {"reasoning_effort": "low"},
            HEAD + "/brief\n<think>\n",
        ),
        (ThinkingDefaults(), {"chat_template_kwargs": {"enable_thinking": False}}, CLOSED),
        # kwargs win over the top-level field for enable_thinking
        (
            ThinkingDefaults(),
            {"reasoning_effort": "none", "chat_template_kwargs": {"enable_thinking": True}},
            OPEN,
        ),
        # a positive effort does not turn thinking back on
        (
            ThinkingDefaults(enable_thinking=False),
            {"reasoning_effort": "high"},
            HEAD + "/careful\n<think>\n\n</think>\n\n",
        ),
        # request kwargs override the launcher's
        (
            ThinkingDefaults(template_kwargs={"enable_thinking": False}),
            {"chat_template_kwargs": {"enable_thinking": True}},
            OPEN,
        ),
        # top-level reasoning_effort overrides the value inside the kwargs
        (
            ThinkingDefaults(),
            {"reasoning_effort": "low", "chat_template_kwargs": {"reasoning_effort": "high"}},
            HEAD + "/brief\n<think>\n",
        ),
        (ThinkingDefaults(reasoning_effort="none"), {}, CLOSED),
        (ThinkingDefaults(reasoning_effort="none", enable_thinking=True), {}, OPEN),
    ],
)
def test_thinking_controls_render(
    defaults: ThinkingDefaults, request_fields: dict, expected: str
) -> None:
    assert rendered(defaults, **request_fields) == expected


def test_rendered_prompt_knows_it_opens_a_thinking_block() -> None:
    plan = resolve_thinking(ThinkingDefaults())
    assert render_prompt(TEMPLATE, MESSAGES, template_kwargs=plan.template_kwargs).opens_reasoning
    plan = resolve_thinking(ThinkingDefaults(), reasoning_effort="none")
    assert not render_prompt(
        TEMPLATE, MESSAGES, template_kwargs=plan.template_kwargs
    ).opens_reasoning


def test_budget_comes_from_the_request_else_the_launcher() -> None:
    assert resolve_thinking(ThinkingDefaults(reasoning_budget=4096)).budget == 4096
    assert (
        resolve_thinking(
            ThinkingDefaults(reasoning_budget=4096), reasoning_budget_tokens=128
        ).budget
        == 128
    )
    assert resolve_thinking(ThinkingDefaults()).budget == -1


@pytest.mark.parametrize(
    "request_fields",
    [
        {"chat_template_kwargs": {"enable_thinking": "true"}},
        {"chat_template_kwargs": {"enable_thinking": 1}},
        {"reasoning_effort": "Very High!"},
        {"reasoning_effort": ""},
        {"reasoning_budget_tokens": -2},
    ],
)
def test_invalid_thinking_fields(request_fields: dict) -> None:
    with pytest.raises(InvalidRequestError):
        resolve_thinking(ThinkingDefaults(), **request_fields)
