"""What a chat template can render, and the polyfills for what it cannot.

Capabilities are probed by rendering small conversations with marker strings (the way
llama.cpp's template capability detection does). A template without tool support gets
the tools described in its system message and tool calls written into the assistant
content in the Hermes format; one without a system role gets the system text merged
into the first user message.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvmem.chat.tool_calls import ToolFormat
from kvmem.chat.tool_grammar import render_tool_call

RenderFn = Callable[..., str]

_PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "kvmem_probe_tool",
        "description": "probe",
        "parameters": {
            "type": "object",
            "properties": {"arg": {"type": "string"}},
            "required": ["arg"],
        },
    },
}


@dataclass(frozen=True, slots=True)
class TemplateCaps:
    supports_system_role: bool = True
    supports_tools: bool = False
    supports_tool_calls: bool = False
    supports_tool_responses: bool = True
    requires_typed_content: bool = False


def _renders(render: RenderFn, marker: str, messages: list[dict[str, Any]], **kwargs: Any) -> bool:
    try:
        return marker in render(messages, add_generation_prompt=False, **kwargs)
    except Exception:  # a probe that breaks the template means "not supported"
        return False


def detect_caps(render: RenderFn) -> TemplateCaps:
    """Probe `render(messages, add_generation_prompt=..., tools=...)` for capabilities."""
    user = {"role": "user", "content": "kvmem-user-marker"}
    typed = not _renders(render, "kvmem-user-marker", [user]) and _renders(
        render,
        "kvmem-user-marker",
        [{"role": "user", "content": [{"type": "text", "text": "kvmem-user-marker"}]}],
    )

    def msg(role: str, text: str, **extra: Any) -> dict[str, Any]:
        content: Any = [{"type": "text", "text": text}] if typed else text
        return {"role": role, "content": content, **extra}

    hello = msg("user", "hello")
    call = {
        "id": "call_probe",
        "type": "function",
        "function": {"name": "kvmem_probe_call", "arguments": {"arg": "kvmem-arg-marker"}},
    }
    assistant = msg("assistant", "", tool_calls=[call])
    return TemplateCaps(
        supports_system_role=_renders(
            render, "kvmem-system-marker", [msg("system", "kvmem-system-marker"), hello]
        ),
        supports_tools=_renders(render, "kvmem_probe_tool", [hello], tools=[_PROBE_TOOL]),
        supports_tool_calls=_renders(render, "kvmem_probe_call", [hello, assistant]),
        supports_tool_responses=_renders(
            render,
            "kvmem-tool-marker",
            [hello, assistant, msg("tool", "kvmem-tool-marker", tool_call_id="call_probe")],
        ),
        requires_typed_content=typed,
    )


def tools_system_prompt(tools: list[dict[str, Any]]) -> str:
    """Hermes-style tool instructions, for templates that do not render `tools` themselves."""
    listing = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{listing}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments "
        "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


def apply_polyfills(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    caps: TemplateCaps,
    fmt: ToolFormat,
) -> list[dict[str, Any]]:
    """Rewrite `messages` (copies) into what the template can render."""
    out = [dict(m) for m in messages]
    if tools and not caps.supports_tools:
        prompt = tools_system_prompt(tools)
        if out and out[0]["role"] == "system":
            out[0]["content"] = f"{out[0]['content']}\n\n{prompt}" if out[0]["content"] else prompt
        else:
            out.insert(0, {"role": "system", "content": prompt})
    for m in out:
        if m.get("tool_calls") and not caps.supports_tool_calls:
            text = "\n".join(
                render_tool_call(fmt, c["function"]["name"], c["function"]["arguments"])
                for c in m["tool_calls"]
            )
            m["content"] = f"{m['content']}\n{text}" if m.get("content") else text
            del m["tool_calls"]
        if m["role"] == "tool" and not caps.supports_tool_responses:
            m["role"] = "user"
            m["content"] = f"<tool_response>\n{m['content']}\n</tool_response>"
            m.pop("tool_call_id", None)
    if not caps.supports_system_role:
        out = _merge_system(out)
    if caps.requires_typed_content:
        for m in out:
            if isinstance(m.get("content"), str):
                m["content"] = [{"type": "text", "text": m["content"]}]
    return out


def _merge_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    merged: list[dict[str, Any]] = []
    pending = ""
    for m in messages:
        if m["role"] == "system":
            pending = f"{pending}\n\n{m['content']}" if pending else m["content"]
            continue
        if pending and m["role"] == "user":
            m = {**m, "content": f"{pending}\n\n{m['content']}"}
            pending = ""
        merged.append(m)
    if pending:
        merged.insert(0, {"role": "user", "content": pending})
    return merged
