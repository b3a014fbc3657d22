"""Where a chat template puts a message's text: the role headers, learned once.

Probed like the capabilities (`template_caps`): small conversations with marker texts are
rendered when the template is compiled, never per request. A role's header is the text the
template writes right before a message's content (`<|im_start|>user\\n`): the text between
two contents less the previous turn's end (the text after a lone message's content). The
tool header is the text common to the starts of two consecutive tool results (templates
group them in one turn). The generation prompt is what `add_generation_prompt` appends.
A probe that fails leaves that header unknown; span finding then works without it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

RenderFn = Callable[..., str]

_A, _B, _C, _T1, _T2 = (f"kvmem-layout-{x}" for x in ("a", "b", "c", "t1", "t2"))


@dataclass(frozen=True, slots=True)
class TemplateLayout:
    headers: dict[str, str] = field(default_factory=dict)  # role -> its header text
    generation_prompt: str = ""


def _after(text: str, marker: str) -> str:
    return text[text.index(marker) + len(marker) :]


def _between(text: str, first: str, second: str) -> str:
    start = text.index(first) + len(first)
    return text[start : text.index(second, start)]


def _minus_prefix(gap: str, prefix: str) -> str | None:
    return gap[len(prefix) :] or None if gap.startswith(prefix) else None


def _common_suffix(a: str, b: str) -> str:
    n = len(os.path.commonprefix([a[::-1], b[::-1]]))
    return a[len(a) - n :] if n else ""


def _msg(role: str, content: str, **extra: Any) -> dict[str, Any]:
    return {"role": role, "content": content, **extra}


def _probe(fn: Callable[[], str | None]) -> str | None:
    try:
        return fn()
    except Exception:  # a probe the template cannot render leaves the header unknown
        return None


def detect_layout(render: RenderFn) -> TemplateLayout:
    """Probe `render(messages, add_generation_prompt=...)` for the role headers."""
    user_a, asst_b, user_c = _msg("user", _A), _msg("assistant", _B), _msg("user", _C)

    def r(messages: list[dict[str, Any]], gen: bool = False) -> str:
        return render(messages, add_generation_prompt=gen)

    def user() -> str | None:
        turn_end = _after(r([user_a, asst_b]), _B)
        return _minus_prefix(_between(r([user_a, asst_b, user_c]), _B, _C), turn_end)

    def assistant() -> str | None:
        turn_end = _after(r([user_a]), _A)
        return _minus_prefix(_between(r([user_a, asst_b, user_c]), _A, _B), turn_end)

    def tool() -> str | None:
        call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {}}}
        text = r(
            [
                user_a,
                _msg("assistant", "", tool_calls=[call]),
                _msg("tool", _T1, tool_call_id="c1"),
                _msg("tool", _T2, tool_call_id="c1"),
            ]
        )
        before = text[: text.index(_T1)]
        return _common_suffix(before, _between(text, _T1, _T2)) or None

    def generation() -> str | None:
        plain, gen = r([user_a]), r([user_a], True)
        return gen[len(plain) :] if gen.startswith(plain) else None

    headers = {
        role: h
        for role, h in (
            ("user", _probe(user)),
            ("assistant", _probe(assistant)),
            ("tool", _probe(tool)),
        )
        if h
    }
    return TemplateLayout(headers, _probe(generation) or "")
