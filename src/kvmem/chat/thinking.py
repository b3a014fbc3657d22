"""Thinking controls: launcher defaults and per-request overrides -> template kwargs + budget.

Precedence (as in the original llama-kvmem-server):
- request `chat_template_kwargs` override the launcher's `--chat-template-kwargs`,
  `--enable-thinking`/`--reasoning` and `--reasoning-effort`;
- a top-level `reasoning_effort` overrides `reasoning_effort` inside the kwargs;
  `default` removes the effort (the template's own default applies); `none` disables
  thinking (`enable_thinking=false`) unless the request kwargs set `enable_thinking`;
  a positive effort never turns thinking back on;
- `enable_thinking` must be a JSON boolean;
- `reasoning_budget_tokens` (else `--reasoning-budget`): -1 unlimited, 0 ends thinking at
  once, N > 0 closes the thinking block after N tokens. `max_tokens` bounds the whole output.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvmem.errors import InvalidRequestError

EFFORT_DEFAULT = "default"
EFFORT_NONE = "none"
_EFFORT_PATTERN = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")


@dataclass(frozen=True, slots=True)
class ThinkingDefaults:
    """What the launcher flags set."""

    template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    reasoning_effort: str | None = None  # None or "default": the template's own default
    enable_thinking: bool | None = None  # --enable-thinking / --reasoning on|off
    reasoning_budget: int = -1


@dataclass(slots=True)
class ThinkingPlan:
    """What one request renders and enforces."""

    template_kwargs: dict[str, Any]
    budget: int  # -1: unlimited; 0: close the thinking block at once; N: after N tokens

    @property
    def thinking_disabled(self) -> bool:
        return self.template_kwargs.get("enable_thinking") is False


def check_effort(value: Any, param: str = "reasoning_effort") -> str:
    if not isinstance(value, str) or not _EFFORT_PATTERN.match(value):
        raise InvalidRequestError(
            f"'{param}' must be a level such as none, minimal, low, medium, high, xhigh or default",
            param,
        )
    return value


def _check_enable_thinking(kwargs: Mapping[str, Any], param: str) -> None:
    if "enable_thinking" in kwargs and not isinstance(kwargs["enable_thinking"], bool):
        raise InvalidRequestError("'enable_thinking' must be a JSON boolean (true or false)", param)


def resolve_thinking(
    defaults: ThinkingDefaults,
    *,
    reasoning_effort: str | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    reasoning_budget_tokens: int | None = None,
) -> ThinkingPlan:
    """Combine the launcher defaults with one request's thinking fields."""
    kwargs: dict[str, Any] = dict(defaults.template_kwargs)
    if defaults.enable_thinking is not None:
        kwargs["enable_thinking"] = defaults.enable_thinking
    launcher_explicit = (
        "enable_thinking" in defaults.template_kwargs or defaults.enable_thinking is not None
    )
    _apply_effort(kwargs, defaults.reasoning_effort, explicit_enable=launcher_explicit)
    if chat_template_kwargs is not None:
        if not isinstance(chat_template_kwargs, Mapping):
            raise InvalidRequestError(
                "'chat_template_kwargs' must be an object", "chat_template_kwargs"
            )
        _check_enable_thinking(chat_template_kwargs, "chat_template_kwargs.enable_thinking")
        kwargs.update(chat_template_kwargs)
    _check_enable_thinking(kwargs, "chat_template_kwargs.enable_thinking")
    if reasoning_effort is not None:
        check_effort(reasoning_effort)
        explicit = chat_template_kwargs is not None and "enable_thinking" in chat_template_kwargs
        _apply_effort(kwargs, reasoning_effort, explicit_enable=explicit)
    budget = (
        defaults.reasoning_budget if reasoning_budget_tokens is None else reasoning_budget_tokens
    )
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < -1:
        raise InvalidRequestError(
            "'reasoning_budget_tokens' must be -1 (unlimited), 0 or a positive integer",
            "reasoning_budget_tokens",
        )
    return ThinkingPlan(template_kwargs=kwargs, budget=budget)


def _apply_effort(kwargs: dict[str, Any], effort: str | None, *, explicit_enable: bool) -> None:
    if effort is None:
        return
    if effort == EFFORT_DEFAULT:
        kwargs.pop("reasoning_effort", None)
    elif effort == EFFORT_NONE:
        kwargs.pop("reasoning_effort", None)
        if not explicit_enable:
            kwargs["enable_thinking"] = False
    else:
        kwargs["reasoning_effort"] = effort
