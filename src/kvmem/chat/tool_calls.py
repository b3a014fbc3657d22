"""Tool calls in a model's output: the formats, and parsing a finished text.

Formats:
- HERMES: Hermes/Qwen2.5/Qwen3 `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`,
  any number of calls in one turn.
- QWEN3_CODER: Qwen3-Coder / Qwen3.5 XML, `<tool_call><function=NAME><parameter=P>value
  </parameter></function></tool_call>`; parameter values are typed by the tool's schema.
- LLAMA3_JSON: Llama 3.x `{"name": ..., "parameters": {...}}` as the whole output
  (optionally after `<|python_tag|>`; several calls separated by `;`).
- MISTRAL: `[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": ...}]` (v3) and
  `[TOOL_CALLS]NAME[ARGS]{...}` (v11+, repeated for several calls).

Output that does not parse stays content: parsing never raises. Text before the first
call is content; text after the last complete call is not (llama-server's grammar allows
nothing there; kvmem stops generating there, see tool_blocks.py). Identical calls in one
reply are one call.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class ToolFormat(Enum):
    HERMES = "hermes"
    QWEN3_CODER = "qwen3_coder"
    LLAMA3_JSON = "llama3_json"
    MISTRAL = "mistral"


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One parsed call; `arguments` is the JSON text of the arguments object."""

    name: str
    arguments: str
    id: str = field(default_factory=lambda: new_call_id())


@dataclass(slots=True)
class ParsedOutput:
    content: str
    tool_calls: list[ToolCall]


_ID_ALPHABET = string.ascii_letters + string.digits


def new_call_id(prefix: str = "call_", length: int = 24) -> str:
    return prefix + "".join(secrets.choice(_ID_ALPHABET) for _ in range(length))


def detect_tool_format(template_source: str) -> ToolFormat:
    """The tool-call format a chat template teaches its model (Hermes when it has none)."""
    if "<function=" in template_source:
        return ToolFormat.QWEN3_CODER
    if "<tool_call>" in template_source:
        return ToolFormat.HERMES
    if "[TOOL_CALLS]" in template_source:
        return ToolFormat.MISTRAL
    if "<|python_tag|>" in template_source or "ipython" in template_source:
        return ToolFormat.LLAMA3_JSON
    return ToolFormat.HERMES


def start_markers(fmt: ToolFormat) -> tuple[str, ...]:
    """Text that begins a tool call in `fmt`. `{` and a code fence count only at the start
    of the output (Llama-3 JSON; Hermes' bare-JSON calls, see `parse_bare_json`)."""
    if fmt is ToolFormat.HERMES:
        return ("<tool_call>", "{", "```")
    if fmt is ToolFormat.QWEN3_CODER:
        return ("<tool_call>", "<function=")
    if fmt is ToolFormat.MISTRAL:
        return ("[TOOL_CALLS]",)
    return ("<|python_tag|>", "{")


def parse_tool_calls(
    text: str, fmt: ToolFormat, tools: list[dict[str, Any]] | None = None
) -> ParsedOutput:
    """Split `text` into content and tool calls; unparseable calls stay in the content."""
    parsed = _parse(text, fmt, tools)
    parsed.tool_calls = unique_calls(parsed.tool_calls)
    return parsed


def call_key(call: ToolCall) -> tuple[str, str]:
    """What makes two calls the same call: the name and the arguments (key order aside)."""
    return call.name, json.dumps(json.loads(call.arguments), sort_keys=True)


def unique_calls(calls: list[ToolCall]) -> list[ToolCall]:
    """`calls` without repeats of an earlier identical call (small models loop on one)."""
    seen: set[tuple[str, str]] = set()
    kept: list[ToolCall] = []
    for call in calls:
        key = call_key(call)
        if key not in seen:
            seen.add(key)
            kept.append(call)
    return kept


def tool_names(tools: list[dict[str, Any]] | None) -> set[str]:
    """The function names of the request's tools."""
    return {
        name
        for t in tools or []
        if isinstance(name := (t.get("function") or {}).get("name"), str) and name
    }


def _parse(text: str, fmt: ToolFormat, tools: list[dict[str, Any]] | None) -> ParsedOutput:
    if fmt is ToolFormat.HERMES:
        parsed = _parse_tagged(text, _hermes_call, _TAGGED)
        if not parsed.tool_calls and tools:
            return parse_bare_json(text, tools)
        return parsed
    if fmt is ToolFormat.QWEN3_CODER:
        pattern = _TAGGED if "<tool_call>" in text else _BARE_FUNCTION
        return _parse_tagged(text, lambda body: _xml_calls(body, tools or []), pattern)
    if fmt is ToolFormat.MISTRAL:
        return _parse_mistral(text)
    return _parse_llama3(text)


def arguments_json(arguments: Any) -> str | None:
    """Arguments as JSON object text, or None if they are not an object."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return json.dumps(arguments, ensure_ascii=False)


def call_from_object(obj: Any, args_key: str = "arguments") -> ToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    raw = obj.get(args_key, obj.get("parameters" if args_key == "arguments" else "arguments", {}))
    args = arguments_json(raw)
    if args is None:
        return None
    call_id = obj.get("id")
    if isinstance(call_id, str) and call_id:
        return ToolCall(obj["name"], args, call_id)
    return ToolCall(obj["name"], args)


_TAGGED = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.S)
_BARE_FUNCTION = re.compile(r"(<function=[^>\n]+>.*?</function>)", re.S)


def _parse_tagged(text: str, parse_body: Any, pattern: re.Pattern[str]) -> ParsedOutput:
    calls: list[ToolCall] = []
    content: list[str] = []
    pos = 0
    for match in pattern.finditer(text):
        parsed = parse_body(match.group(1))
        if not parsed:
            continue
        content.append(text[pos : match.start()])
        calls.extend(parsed)
        pos = match.end()
    return ParsedOutput("".join(content).strip() if calls else text, calls)


def _strip_partial_close(body: str, close: str) -> str:
    """Drop a closing tag cut short by max_tokens (`...}\n</tool_ca`)."""
    body = body.rstrip()
    for n in range(len(close) - 1, 0, -1):
        if body.endswith(close[:n]):
            return body[:-n]
    return body


def _hermes_call(body: str) -> list[ToolCall]:
    try:
        obj = json.loads(_strip_partial_close(body, "</tool_call>").strip())
    except json.JSONDecodeError:
        return []
    call = call_from_object(obj)
    return [call] if call else []


_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)(?:</function>|\Z)", re.S)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)(?:</parameter>|(?=<parameter=)|\Z)", re.S)


def _xml_calls(body: str, tools: list[dict[str, Any]]) -> list[ToolCall]:
    calls: list[ToolCall] = []
    for fn in _FUNCTION.finditer(body):
        name = fn.group(1).strip()
        schema = _parameter_schemas(tools, name)
        args: dict[str, Any] = {}
        for param in _PARAMETER.finditer(fn.group(2)):
            key = param.group(1).strip()
            args[key] = _typed_value(_strip_one_newline(param.group(2)), schema.get(key, {}))
        if name:
            calls.append(ToolCall(name, json.dumps(args, ensure_ascii=False)))
    return calls


def _strip_one_newline(value: str) -> str:
    value = value[1:] if value.startswith("\n") else value
    return value[:-1] if value.endswith("\n") else value


def _parameter_schemas(tools: list[dict[str, Any]], name: str) -> dict[str, Any]:
    for tool in tools:
        fn = tool.get("function", {})
        if fn.get("name") == name:
            props = (fn.get("parameters") or {}).get("properties") or {}
            return props if isinstance(props, dict) else {}
    return {}


def _typed_value(raw: str, schema: dict[str, Any]) -> Any:
    kind = schema.get("type") if isinstance(schema, dict) else None
    if kind == "string":
        return raw
    text = raw.strip()
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return raw
    if kind is None or kind in ("integer", "number", "boolean", "object", "array", "null"):
        return value
    return raw


def _parse_mistral(text: str) -> ParsedOutput:
    at = text.find("[TOOL_CALLS]")
    if at == -1:
        return ParsedOutput(text, [])
    head, rest = text[:at], text[at + len("[TOOL_CALLS]") :]
    stripped = rest.strip()
    calls = _mistral_array(stripped) if stripped.startswith("[") else _mistral_named(rest)
    return ParsedOutput(head.strip(), calls) if calls else ParsedOutput(text, [])


def _mistral_array(text: str) -> list[ToolCall]:
    """v3: one JSON array of call objects (every item must be a call)."""
    try:
        items, _ = json.JSONDecoder().raw_decode(text)
    except json.JSONDecodeError:
        return []
    if not isinstance(items, list):
        return []
    calls = [call_from_object(item) for item in items]
    return [c for c in calls if c is not None] if all(calls) else []


def _mistral_named(text: str) -> list[ToolCall]:
    """v11+: `NAME[ARGS]{...}` segments separated by `[TOOL_CALLS]`; the calls up to the
    first segment that is not one."""
    calls: list[ToolCall] = []
    for segment in text.split("[TOOL_CALLS]"):
        name, sep, args = segment.partition("[ARGS]")
        try:
            obj, _ = json.JSONDecoder().raw_decode(args.strip()) if sep else (None, 0)
        except json.JSONDecodeError:
            obj = None
        call = call_from_object({"name": name.strip(), "arguments": obj}) if sep else None
        if call is None:
            return calls
        calls.append(call)
    return calls


def _parse_llama3(text: str) -> ParsedOutput:
    body = text.strip()
    if body.startswith("<|python_tag|>"):
        body = body[len("<|python_tag|>") :].strip()
    if not body.startswith("{"):
        return ParsedOutput(text, [])
    calls = _json_calls(body, "parameters", None)
    return ParsedOutput("", calls) if calls else ParsedOutput(text, [])


def _json_calls(body: str, args_key: str, names: set[str] | None) -> list[ToolCall]:
    """The call objects `body` starts with (separated by whitespace, `,` or `;`), up to
    the first thing that is not one (with `names`, one naming a given tool)."""
    decoder = json.JSONDecoder()
    calls: list[ToolCall] = []
    pos = 0
    while pos < len(body):
        try:
            obj, pos = decoder.raw_decode(body, pos)
        except json.JSONDecodeError:
            return calls
        call = call_from_object(obj, args_key=args_key)
        if call is None or (names is not None and call.name not in names):
            return calls
        calls.append(call)
        while pos < len(body) and body[pos] in " \t\r\n,;":
            pos += 1
    return calls


_FENCE = re.compile(r"^```[A-Za-z0-9_-]*[ \t]*\n?(.*?)\n?```$", re.S)
_FENCE_OPEN = re.compile(r"^```[A-Za-z0-9_-]*[ \t]*\n(.*)$", re.S)  # closing fence not reached


def parse_bare_json(text: str, tools: list[dict[str, Any]]) -> ParsedOutput:
    """Calls written as bare JSON, without `<tool_call>` tags (small Qwen2.5-Coder models do).

    The output, optionally in one code fence, must start with a JSON object
    `{"name": N, "arguments": {...}}` (or `"parameters"`) where N names a given tool;
    further such objects are further calls. Whatever follows the last call (small models
    ramble on with more objects or prose, or are cut off by max_tokens) is dropped, like
    text after a tagged call. Prose before the object keeps the whole output content, so
    does any JSON answer without tools.
    """
    body = text.strip()
    fenced = _FENCE.match(body) or _FENCE_OPEN.match(body)
    if fenced:
        body = fenced.group(1).strip()
    if not body.startswith("{"):
        return ParsedOutput(text, [])
    calls = _json_calls(body, "arguments", tool_names(tools))
    return ParsedOutput("", calls) if calls else ParsedOutput(text, [])
