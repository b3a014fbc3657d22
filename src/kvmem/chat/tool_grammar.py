"""Grammars that force the model to call a tool (`tool_choice: required` or a named
function), in the tool-call format of the chat template, like llama-server does.

The call text the grammar produces is exactly what `render_tool_call` writes back into
the history when a client echoes the call, so the next turn reuses its KV.
"""

from __future__ import annotations

import json
from typing import Any

from kvmem.chat.json_grammar import GrammarBuilder, gbnf_literal
from kvmem.chat.schema_check import check_grammar_text, check_schema
from kvmem.chat.tool_calls import ToolFormat


def _functions(tools: list[dict[str, Any]], only: str | None) -> list[dict[str, Any]]:
    fns = [t["function"] for t in tools if isinstance(t.get("function"), dict)]
    return [f for f in fns if only is None or f.get("name") == only]


def tool_call_grammar(
    fmt: ToolFormat, tools: list[dict[str, Any]], only: str | None = None, *, parallel: bool = False
) -> str:
    """A grammar for one call of `tools` (just `only`, when given); several with `parallel`."""
    fns = _functions(tools, only)
    assert fns, "the request validation guarantees at least one matching function"
    for fn in fns:
        check_schema(fn.get("parameters") or {"type": "object"}, "tools")
    grammar = _tool_call_grammar(fmt, fns, parallel)
    check_grammar_text(grammar, "tools")
    return grammar


def _tool_call_grammar(fmt: ToolFormat, fns: list[dict[str, Any]], parallel: bool) -> str:
    builder = GrammarBuilder()
    alts = []
    for i, fn in enumerate(fns):
        params = fn.get("parameters") or {"type": "object"}
        if fmt is ToolFormat.QWEN3_CODER:
            alts.append(_xml_call(builder, fn["name"], params, i))
            continue
        args = builder.schema(_as_object(params), f"fn{i}-args")
        name = gbnf_literal(json.dumps(fn["name"], ensure_ascii=False))
        if fmt is ToolFormat.LLAMA3_JSON:
            alts.append(f'"{{\\"name\\": " {name} ", \\"parameters\\": " {args} "}}"')
        else:
            alts.append(f'"{{\\"name\\": " {name} ", \\"arguments\\": " {args} "}}"')
    call = builder.add("call", " | ".join(alts))
    if fmt is ToolFormat.HERMES:
        one = builder.add("tool-call", f'"<tool_call>\\n" {call} "\\n</tool_call>"')
        return builder.render(_repeat(one, '"\\n"', parallel))
    if fmt is ToolFormat.QWEN3_CODER:
        one = builder.add("tool-call", f'"<tool_call>\\n" {call} "</tool_call>"')
        return builder.render(_repeat(one, '"\\n"', parallel))
    if fmt is ToolFormat.MISTRAL:
        return builder.render(
            f'"[TOOL_CALLS][" {_repeat(call, chr(34) + ", " + chr(34), parallel)} "]"'
        )
    return builder.render(_repeat(call, '"; "', parallel))


def _repeat(rule: str, separator: str, parallel: bool) -> str:
    return f"{rule} ( {separator} {rule} )*" if parallel else rule


def _as_object(params: Any) -> dict[str, Any]:
    if not isinstance(params, dict):
        return {"type": "object"}
    return params if params.get("type", "object") == "object" else {"type": "object"}


def _xml_call(builder: GrammarBuilder, name: str, params: dict[str, Any], i: int) -> str:
    props = params.get("properties") or {}
    required = set(params.get("required") or [])
    parts = [gbnf_literal(f"<function={name}>\n")]
    for key, schema in props.items():
        value = _xml_value(builder, schema, f"fn{i}-{key}")
        param = f"{gbnf_literal(f'<parameter={key}>' + chr(10))} {value} {gbnf_literal(chr(10) + '</parameter>' + chr(10))}"
        parts.append(param if key in required else f"( {param} )?")
    parts.append(gbnf_literal("</function>\n"))
    return builder.add(f"fn{i}-xml", " ".join(parts))


def _xml_value(builder: GrammarBuilder, schema: Any, hint: str) -> str:
    if isinstance(schema, dict) and schema.get("type") == "string" and "enum" not in schema:
        return builder.add("xml-text", "[^<]*")
    if isinstance(schema, dict) and schema.get("type") == "string":
        return builder.add(hint, " | ".join(gbnf_literal(str(v)) for v in schema["enum"]))
    return builder.schema(schema, hint)


def render_tool_call(fmt: ToolFormat, name: str, arguments: dict[str, Any]) -> str:
    """The text of one call in `fmt`, as the grammar above makes the model write it."""
    if fmt is ToolFormat.QWEN3_CODER:
        params = "".join(
            f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}\n</parameter>\n"
            for k, v in arguments.items()
        )
        return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    if fmt is ToolFormat.LLAMA3_JSON:
        return json.dumps({"name": name, "parameters": arguments}, ensure_ascii=False)
    if fmt is ToolFormat.MISTRAL:
        return f"[TOOL_CALLS][{body}]"
    return f"<tool_call>\n{body}\n</tool_call>"
