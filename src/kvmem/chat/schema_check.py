"""JSON Schema checks before a grammar is built from it, and bounds on grammar text.

A schema reaches the grammar builder only after `check_schema` has verified, without
recursion: every keyword the builder reads has the right type; repetition bounds
(minLength/maxLength, minItems/maxItems) are non-negative integers up to MAX_REPEAT and
min <= max (llama.cpp's grammar parser allocates without bound for `x{5,2}`); minimum <=
maximum; nesting depth, node count, enum/const sizes and pattern lengths are bounded.
A local `$ref` is resolved and its target checked too (once per reference), so a bad
keyword the walk would not otherwise reach (`{"$ref": "#/x", "x": {...}}`) is found.
A violation is an InvalidRequestError naming the keyword and where it is.

`check_grammar_text` checks the finished grammar (`kvmem.chat.grammar_check`: syntax,
satisfiability, ambiguity and size limits), for built grammars and for grammars a client
sends as text.
"""

from __future__ import annotations

import json
from typing import Any

from kvmem.chat.grammar_check import check_grammar
from kvmem.errors import InvalidRequestError

MAX_DEPTH = 32  # schema nesting
MAX_NODES = 4096  # subschemas in one schema
MAX_ENUM_VALUES = 1000  # enum values, over the whole schema
MAX_LITERAL_CHARS = 64_000  # enum + const text, over the whole schema
MAX_PATTERN_CHARS = 1000
MAX_REPEAT = 1000  # minLength/maxLength/minItems/maxItems
MAX_PROPERTIES = 1000  # properties over the whole schema

_TYPES = {"object", "array", "string", "number", "integer", "boolean", "null"}
_COUNTS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")
_PAIRS = (
    ("minLength", "maxLength"),
    ("minItems", "maxItems"),
    ("minProperties", "maxProperties"),
    ("minimum", "maximum"),
    ("exclusiveMinimum", "exclusiveMaximum"),
)
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")
_SCHEMA_ONE = ("items", "additionalProperties", "not", "contains")


def _fail(param: str, where: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(f"invalid JSON schema at {where}: {message}", param)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_schema(schema: Any, param: str = "response_format") -> None:
    """InvalidRequestError(param) unless the grammar builder can use `schema` safely."""
    budget = {"nodes": 0, "enum": 0, "chars": 0, "props": 0}
    stack: list[tuple[Any, str, int]] = [(schema, "#", 1)]
    refs: set[str] = set()  # each local $ref's target is checked once, where it points
    while stack:
        node, where, depth = stack.pop()
        if isinstance(node, bool):
            continue
        if not isinstance(node, dict):
            raise _fail(param, where, "a schema must be an object or a boolean")
        budget["nodes"] += 1
        if budget["nodes"] > MAX_NODES:
            raise _fail(param, where, f"more than {MAX_NODES} subschemas")
        if depth > MAX_DEPTH:
            raise _fail(param, where, f"nested deeper than {MAX_DEPTH} levels")
        _check_keywords(node, where, param, budget)
        for key in _SCHEMA_LISTS:
            if key in node:
                items = node[key]
                if not isinstance(items, list) or (key != "prefixItems" and not items):
                    raise _fail(param, f"{where}/{key}", f"'{key}' must be a non-empty array")
                if key == "allOf" and not all(isinstance(part, dict) for part in items):
                    raise _fail(param, f"{where}/{key}", "'allOf' must hold schema objects")
                stack.extend((s, f"{where}/{key}/{i}", depth + 1) for i, s in enumerate(items))
        for key in _SCHEMA_MAPS:
            if key in node:
                items = node[key]
                if not isinstance(items, dict):
                    raise _fail(param, f"{where}/{key}", f"'{key}' must be an object")
                if key == "properties":
                    budget["props"] += len(items)
                    if budget["props"] > MAX_PROPERTIES:
                        raise _fail(param, where, f"more than {MAX_PROPERTIES} properties")
                stack.extend((s, f"{where}/{key}/{k}", depth + 1) for k, s in items.items())
        for key in _SCHEMA_ONE:
            if key == "items" and isinstance(node.get(key), list):  # a tuple (draft-04)
                stack.extend((s, f"{where}/items/{i}", depth + 1) for i, s in enumerate(node[key]))
            elif key in node:
                stack.append((node[key], f"{where}/{key}", depth + 1))
        ref = node.get("$ref")
        if isinstance(ref, str) and ref not in refs:
            refs.add(ref)
            target = resolve_ref(schema, ref)
            if target is not None:
                stack.append((target, ref, depth + 1))


def resolve_ref(root: Any, ref: str) -> Any:
    """The node a local `$ref` (`#`, `#/a/b`, JSON-pointer escapes) points to, or None."""
    if ref == "#":
        return root
    if not ref.startswith("#/"):
        return None
    node = root
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _check_keywords(node: dict[str, Any], where: str, param: str, budget: dict[str, int]) -> None:
    kind = node.get("type")
    if kind is not None:
        kinds = kind if isinstance(kind, list) else [kind]
        if not kinds or not all(isinstance(k, str) and k in _TYPES for k in kinds):
            raise _fail(param, f"{where}/type", f"'type' must be one of {sorted(_TYPES)}")
    for key in _COUNTS:
        if key in node:
            value = node[key]
            if not _is_int(value) or value < 0:
                raise _fail(param, f"{where}/{key}", f"'{key}' must be a non-negative integer")
            if value > MAX_REPEAT:
                raise _fail(param, f"{where}/{key}", f"'{key}' is larger than {MAX_REPEAT}")
    for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"):
        value = node.get(key)
        draft4 = key.startswith("exclusive") and isinstance(value, bool)
        if key in node and not (_is_number(value) or draft4):
            raise _fail(param, f"{where}/{key}", f"'{key}' must be a number")
    for low, high in _PAIRS:
        a, b = node.get(low), node.get(high)
        if _is_number(a) and _is_number(b) and a > b:
            raise _fail(
                param,
                f"{where}/{low}",
                f"'{low}' ({node[low]}) is greater than '{high}' ({node[high]}): "
                "no value can match",
            )
    required = node.get("required")
    if required is not None and (
        not isinstance(required, list) or not all(isinstance(r, str) for r in required)
    ):
        raise _fail(param, f"{where}/required", "'required' must be an array of strings")
    if "enum" in node:
        values = node["enum"]
        if not isinstance(values, list) or not values:
            raise _fail(param, f"{where}/enum", "'enum' must be a non-empty array")
        budget["enum"] += len(values)
        if budget["enum"] > MAX_ENUM_VALUES:
            raise _fail(param, f"{where}/enum", f"more than {MAX_ENUM_VALUES} enum values")
        budget["chars"] += sum(len(json.dumps(v, ensure_ascii=False)) for v in values)
    if "const" in node:
        budget["chars"] += len(json.dumps(node["const"], ensure_ascii=False))
    if budget["chars"] > MAX_LITERAL_CHARS:
        raise _fail(param, where, f"enum and const values longer than {MAX_LITERAL_CHARS} chars")
    pattern = node.get("pattern")
    if pattern is not None and (not isinstance(pattern, str) or len(pattern) > MAX_PATTERN_CHARS):
        raise _fail(
            param, f"{where}/pattern", f"'pattern' must be a string of <= {MAX_PATTERN_CHARS}"
        )
    ref = node.get("$ref")
    if ref is not None and not isinstance(ref, str):
        raise _fail(param, f"{where}/$ref", "'$ref' must be a string")


def check_grammar_text(grammar: str, param: str = "grammar") -> None:
    """InvalidRequestError unless llama.cpp can use `grammar` safely: every grammar, sent
    as text or built from a schema or tools, passes `kvmem.chat.grammar_check`."""
    check_grammar(grammar, param)
