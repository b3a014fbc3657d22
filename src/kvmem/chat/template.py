"""Jinja chat templates, rendered in a sandbox with the HF/llama.cpp helpers.

The template comes from the GGUF (`tokenizer.chat_template`), from `--chat-template`
(inline Jinja or a built-in name) or `--chat-template-file`. Helpers available to
templates: `raise_exception`, `strftime_now`, a `tojson` filter with HF semantics
(no HTML escaping; `indent`, `separators`, `sort_keys`), `bos_token`, `eos_token`,
`add_generation_prompt`, `tools`, `date_string`, and any template kwargs
(`enable_thinking`, `reasoning_effort`, ...).
"""

from __future__ import annotations

import datetime
import json
import threading
from dataclasses import dataclass, field
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from kvmem.chat.builtin_templates import BUILTIN_TEMPLATES, CHATML
from kvmem.chat.protocol import ModelInfoLike
from kvmem.chat.reasoning import ReasoningMarkers, markers_for_template
from kvmem.chat.template_caps import TemplateCaps, apply_polyfills, detect_caps
from kvmem.chat.template_layout import TemplateLayout, detect_layout
from kvmem.chat.tool_calls import ToolFormat, detect_tool_format
from kvmem.errors import ConfigError, TemplateError

CHATML_TEMPLATE = CHATML


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


def _tojson(
    value: Any,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
    ensure_ascii: bool = False,
) -> str:
    return json.dumps(
        value,
        ensure_ascii=ensure_ascii,
        indent=indent,
        separators=tuple(separators) if separators else None,
        sort_keys=sort_keys,
    )


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def resolve_template_source(value: str, flag: str = "--chat-template") -> str:
    """`--chat-template` value -> Jinja source: a built-in name, or inline Jinja."""
    if value in BUILTIN_TEMPLATES:
        return BUILTIN_TEMPLATES[value]
    if "{{" in value or "{%" in value:
        return value
    names = ", ".join(sorted(BUILTIN_TEMPLATES))
    raise ConfigError(flag, f"{value!r} is neither Jinja source nor a built-in template ({names})")


def check_template_source(source: str, flag: str) -> None:
    """Compile `source`; ConfigError naming `flag` when it is not valid Jinja."""
    try:
        _environment().from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as exc:
        raise ConfigError(
            flag, f"invalid chat template: {exc.message} (line {exc.lineno})"
        ) from None


@dataclass(slots=True)
class TemplateCounters:
    """Requests served by one template: renders, and prompts whose spans were not all
    found (by span name: "query", "control", "trajectory", "live"); shown in /props."""

    renders: int = 0
    unlocated: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def count_render(self) -> None:
        with self.lock:
            self.renders += 1

    def count_unlocated(self, names: tuple[str, ...]) -> None:
        with self.lock:
            for name in names:
                self.unlocated[name] = self.unlocated.get(name, 0) + 1

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {"renders": self.renders, "unlocated": dict(self.unlocated)}


class ChatTemplate:
    """A compiled chat template with its capabilities, tool format and thinking tags.

    `counters.renders` counts `render` calls (one per request); the probes made when the
    template is compiled (capabilities, layout) are not counted."""

    def __init__(
        self,
        source: str,
        *,
        bos_token: str = "",
        eos_token: str = "",
        special_texts: tuple[str, ...] = (),
    ) -> None:
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        # the vocabulary's control-token texts: only the template's own occurrences are
        # tokenized as special tokens (kvmem.chat.markup)
        self.special_texts = tuple(t for t in special_texts if t)
        try:
            self._template = _environment().from_string(source)
        except jinja2.exceptions.TemplateSyntaxError as exc:
            raise TemplateError(
                f"invalid chat template: {exc.message} (line {exc.lineno})"
            ) from None
        self.tool_format: ToolFormat = detect_tool_format(source)
        self.reasoning: ReasoningMarkers | None = markers_for_template(source)
        self.caps: TemplateCaps = detect_caps(self._render_raw)
        self.layout: TemplateLayout = detect_layout(self._render)
        self.counters = TemplateCounters()

    @classmethod
    def from_engine_info(cls, info: ModelInfoLike, override: str | None = None) -> ChatTemplate:
        """The GGUF's template (ChatML if it has none), or `override` (Jinja or a built-in name)."""
        if override is not None:
            source = resolve_template_source(override)
        else:
            source = info.chat_template or CHATML_TEMPLATE
        return cls(
            source,
            bos_token=info.bos_text,
            eos_token=info.eos_text,
            special_texts=tuple(getattr(info, "special_texts", ())),
        )

    def render(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> str:
        """Render normalized messages (see `kvmem.chat.messages`), polyfilling as needed."""
        self.counters.count_render()
        return self._render(
            messages, add_generation_prompt=add_generation_prompt, tools=tools, **kwargs
        )

    def _render(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> str:
        prepared = apply_polyfills(messages, tools, self.caps, self.tool_format)
        return self._render_raw(
            prepared,
            add_generation_prompt=add_generation_prompt,
            tools=tools if tools and self.caps.supports_tools else None,
            **kwargs,
        )

    def _render_raw(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> str:
        now = datetime.datetime.now(datetime.timezone.utc)
        context: dict[str, Any] = {
            "date_string": now.strftime("%d %b %Y"),
            # what llama.cpp gives firefunction-style templates: the time and the tools as
            # indented JSON ("" without tools)
            "datetime": now.strftime("%b %d %Y %H:%M:%S GMT"),
            "functions": json.dumps(tools, indent=2) if tools else "",
            **kwargs,
            "messages": messages,
            "add_generation_prompt": add_generation_prompt,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
        }
        if tools:
            context["tools"] = tools
        try:
            return self._template.render(**context)
        except jinja2.exceptions.TemplateError as exc:
            raise TemplateError(f"chat template error: {exc}") from None
        except (TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
            raise TemplateError(f"chat template error: {type(exc).__name__}: {exc}") from None
