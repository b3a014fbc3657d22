"""JSON Schema -> llama.cpp GBNF grammar.

The grammar forces compact canonical JSON in `json.dumps` style (`{"a": 1, "b": [1, 2]}`):
no free whitespace, so a tiny model cannot wander into endless spaces, and an echoed
tool call re-renders to the same bytes (the next turn reuses its KV).

Supported: type (and type lists), properties/required (required keys first, then the
optional ones, in schema order), enum, const, anyOf/oneOf, allOf of objects, items,
prefixItems (and `items` as a list: a tuple, as draft-04 and llama.cpp read it),
minItems/maxItems, minLength/maxLength, local $ref (#/$defs, #/definitions).
Anything else is an unconstrained JSON value.
"""

from __future__ import annotations

import json
import re
from typing import Any

from kvmem.chat.schema_check import check_grammar_text, check_schema
from kvmem.errors import InvalidRequestError

_PRIMITIVES = {
    "value": "object | array | string | number | boolean | null",
    "object": '"{" ( string ": " value ( ", " string ": " value )* )? "}"',
    "array": '"[" ( value ( ", " value )* )? "]"',
    "string": '"\\"" char* "\\""',
    "char": '[^"\\\\\\x7F\\x00-\\x1F] | "\\\\" ( ["\\\\/bfnrt] | "u" [0-9a-fA-F]{4} )',
    "number": '"-"? integral ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?',
    "integer": '"-"? integral',
    "integral": '"0" | [1-9] [0-9]{0,15}',
    "boolean": '"true" | "false"',
    "null": '"null"',
}
FLAT_ENUM = 32  # enums with more values become a prefix tree of rules
_END = ""  # trie key: a value ends here
_DEPENDS = {
    "value": ("object", "array", "string", "number", "boolean", "null"),
    "object": ("string", "value"),
    "array": ("value",),
    "string": ("char",),
    "number": ("integral",),
    "integer": ("integral",),
}


def gbnf_literal(text: str) -> str:
    """A GBNF string literal matching `text` exactly."""
    out = []
    for ch in text:
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


class GrammarBuilder:
    """Collects GBNF rules; `render` emits them with `root` first."""

    def __init__(self, root_schema: dict[str, Any] | None = None) -> None:
        self._rules: dict[str, str] = {}
        self._root_schema = root_schema or {}
        self._refs_done: set[str] = set()
        self._chains: dict[tuple[str, tuple[str, ...]], str] = {}

    def primitive(self, name: str) -> str:
        if name not in self._rules:
            self._rules[name] = _PRIMITIVES[name]
            for dep in _DEPENDS.get(name, ()):
                self.primitive(dep)
        return name

    def add(self, hint: str, body: str) -> str:
        base = re.sub(r"[^a-zA-Z0-9-]+", "-", hint).strip("-").lower() or "r"
        name, n = base, 1
        while name in self._rules and self._rules[name] != body:
            n += 1
            name = f"{base}-{n}"
        self._rules[name] = body
        return name

    def schema(self, schema: Any, hint: str = "value") -> str:
        """The name of a rule matching `schema`."""
        if schema is True or schema == {} or schema is None:
            return self.primitive("value")
        if not isinstance(schema, dict):
            raise InvalidRequestError(
                f"invalid JSON schema at {hint}: expected an object", "response_format"
            )
        if "$ref" in schema:
            return self._ref(schema["$ref"], hint)
        if "const" in schema:
            return self.add(hint, gbnf_literal(_canonical(schema["const"])))
        if "enum" in schema:
            values = schema["enum"]
            if not isinstance(values, list) or not values:
                raise InvalidRequestError(f"invalid enum at {hint}", "response_format")
            return self.enum([_canonical(v) for v in values], hint)
        for key in ("anyOf", "oneOf"):
            if key in schema:
                alts = [self.schema(s, f"{hint}-{i}") for i, s in enumerate(schema[key])]
                return self.add(hint, " | ".join(alts))
        if "allOf" in schema:
            merged: dict[str, Any] = {"type": "object", "properties": {}, "required": []}
            for part in schema["allOf"]:
                part = self._resolve(part) if isinstance(part, dict) and "$ref" in part else part
                merged["properties"].update(part.get("properties", {}))
                merged["required"].extend(part.get("required", []))
            return self.schema(merged, hint)
        kind = schema.get("type")
        if isinstance(kind, list):
            alts = [self.schema({**schema, "type": k}, f"{hint}-{k}") for k in kind]
            return self.add(hint, " | ".join(alts))
        if kind == "object" or (kind is None and "properties" in schema):
            return self._object(schema, hint)
        if kind == "array" or (kind is None and ("items" in schema or "prefixItems" in schema)):
            return self._array(schema, hint)
        if kind == "string":
            return self._string(schema, hint)
        if kind in ("number", "integer", "boolean", "null"):
            return self.primitive(kind)
        return self.primitive("value")

    def enum(self, texts: list[str], hint: str) -> str:
        """A rule matching one of `texts`: alternatives when few, else a prefix tree of
        rules (llama.cpp keeps one parse alive per alternative that matches so far, and
        JSON strings all start with the same quote)."""
        if len(texts) <= FLAT_ENUM:
            return self.add(hint, " | ".join(gbnf_literal(t) for t in dict.fromkeys(texts)))
        trie: dict[str, Any] = {}
        for text in texts:
            node = trie
            for ch in text:
                node = node.setdefault(ch, {})
            node[_END] = {}
        root = self._reserve(f"{hint}-t")
        todo = [(trie, root)]
        while todo:
            node, name = todo.pop()
            alternatives = ['""'] if _END in node else []
            for ch, child in node.items():
                if ch == _END:
                    continue
                label = ch
                while len(child) == 1 and _END not in child:
                    ((nxt, child),) = child.items()
                    label += nxt
                if list(child) == [_END]:
                    alternatives.append(gbnf_literal(label))
                    continue
                sub = self._reserve(f"{hint}-t")
                alternatives.append(f"{gbnf_literal(label)} {sub}")
                todo.append((child, sub))
            self._rules[name] = " | ".join(alternatives)
        return root

    def _reserve(self, base: str) -> str:
        name, n = base, 1
        while name in self._rules:
            n += 1
            name = f"{base}-{n}"
        self._rules[name] = '""'
        return name

    def render(self, root_body: str) -> str:
        lines = [f"root ::= {root_body}"]
        lines.extend(f"{name} ::= {body}" for name, body in self._rules.items())
        return "\n".join(lines) + "\n"

    def _object(self, schema: dict[str, Any], hint: str) -> str:
        props = schema.get("properties") or {}
        if not isinstance(props, dict):
            raise InvalidRequestError(f"invalid properties at {hint}", "response_format")
        if not props:
            return self.primitive("object")
        required = [k for k in props if k in set(schema.get("required") or [])]
        optional = [k for k in props if k not in required]
        kv = {
            k: self.add(
                f"{hint}-{k}-kv",
                f'{gbnf_literal(json.dumps(k, ensure_ascii=False))} ": " '
                f"{self.schema(props[k], f'{hint}-{k}')}",
            )
            for k in props
        }
        body = '"{" ' + ' ", " '.join(kv[k] for k in required)
        if optional:
            chains = [self._optional_chain(optional[i:], kv, hint) for i in range(len(optional))]
            alts = " | ".join(chains)
            body += f' ( ", " ( {alts} ) )?' if required else f" ( {alts} )?"
        return self.add(hint, body + ' "}"')

    def _optional_chain(self, keys: list[str], kv: dict[str, str], hint: str) -> str:
        # memoized per (hint, keys): without it the alternatives take 2**len(keys) calls;
        # built from the last key back (no recursion: 900 optional keys are fine)
        chains: list[str] = [""] * len(keys)
        for i in range(len(keys) - 1, -1, -1):
            memo_key = (hint, tuple(keys[i:]))
            if memo_key not in self._chains:
                if i == len(keys) - 1:
                    self._chains[memo_key] = kv[keys[i]]
                else:
                    tail = " | ".join(chains[i + 1 :])
                    rest = self.add(f"{hint}-{keys[i]}-rest", f'( ", " ( {tail} ) )?')
                    self._chains[memo_key] = f"{kv[keys[i]]} {rest}"
            chains[i] = self._chains[memo_key]
        return chains[0]

    def _array(self, schema: dict[str, Any], hint: str) -> str:
        tuple_items = schema.get("prefixItems", schema.get("items"))
        if isinstance(tuple_items, list):
            items = [self.schema(s, f"{hint}-{i}") for i, s in enumerate(tuple_items)]
            return self.add(hint, '"[" ' + ' ", " '.join(items) + ' "]"')
        item = self.schema(schema.get("items", {}), f"{hint}-item")
        lo = int(schema.get("minItems", 0))
        hi = schema.get("maxItems")
        if hi is not None and int(hi) == 0:
            return self.add(hint, '"[" "]"')
        more_hi = "" if hi is None else str(int(hi) - 1)
        if lo <= 1:
            rep = f'( ", " {item} )' + ("*" if hi is None else f"{{0,{more_hi}}}")
            seq = f"{item} {rep}"
            return self.add(hint, f'"[" {seq} "]"' if lo == 1 else f'"[" ( {seq} )? "]"')
        rep = f'( ", " {item} ){{{lo - 1},{more_hi}}}'
        return self.add(hint, f'"[" {item} {rep} "]"')

    def _string(self, schema: dict[str, Any], hint: str) -> str:
        lo, hi = schema.get("minLength"), schema.get("maxLength")
        if lo is None and hi is None:
            return self.primitive("string")
        self.primitive("char")
        count = f"{{{int(lo or 0)},{'' if hi is None else int(hi)}}}"
        return self.add(hint, f'"\\"" char{count} "\\""')

    def _resolve(self, ref: Any) -> dict[str, Any]:
        if not isinstance(ref, str) or not ref.startswith("#/"):
            raise InvalidRequestError(
                f"unsupported $ref {ref!r}: only local references", "response_format"
            )
        node: Any = self._root_schema
        for part in ref[2:].split("/"):
            if not isinstance(node, dict) or part not in node:
                raise InvalidRequestError(f"unresolvable $ref {ref!r}", "response_format")
            node = node[part]
        if not isinstance(node, dict):
            raise InvalidRequestError(f"unresolvable $ref {ref!r}", "response_format")
        return node

    def _ref(self, ref: Any, hint: str) -> str:
        target = self._resolve(ref)
        name = "ref-" + re.sub(r"[^a-zA-Z0-9-]+", "-", str(ref)[2:]).strip("-").lower()
        if name not in self._refs_done:
            self._refs_done.add(name)
            self._rules[name] = "null"  # placeholder so recursive references terminate
            self._rules[name] = self.schema(target, f"{name}-body")
        return name


def _canonical(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def json_schema_grammar(schema: Any, param: str = "response_format") -> str:
    """A complete grammar whose root is a JSON value matching `schema` (checked first by
    `kvmem.chat.schema_check`; InvalidRequestError naming the keyword otherwise)."""
    check_schema(schema, param)
    builder = GrammarBuilder(schema if isinstance(schema, dict) else None)
    try:
        grammar = builder.render(builder.schema(schema, "root-value"))
    except RecursionError:
        raise InvalidRequestError("the JSON schema's references nest too deeply", param) from None
    check_grammar_text(grammar, param)
    return grammar


def json_object_grammar() -> str:
    """Any JSON object (`response_format: {"type": "json_object"}`)."""
    builder = GrammarBuilder()
    return builder.render(builder.primitive("object"))
