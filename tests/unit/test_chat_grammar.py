"""JSON-schema and tool-call grammars (exact GBNF), and the call text they correspond to."""

from __future__ import annotations

import pytest

from kvmem.chat.json_grammar import gbnf_literal, json_object_grammar, json_schema_grammar
from kvmem.chat.tool_calls import ToolFormat, parse_tool_calls
from kvmem.chat.tool_grammar import render_tool_call, tool_call_grammar
from kvmem.errors import InvalidRequestError

PRIMITIVES = {
    "value": "object | array | string | number | boolean | null",
    "object": '"{" ( string ": " value ( ", " string ": " value )* )? "}"',
    "array": '"[" ( value ( ", " value )* )? "]"',
    "string": '"\\"" char* "\\""',
    "char": '[^"\\\\\\x7F\\x00-\\x1F] | "\\\\" ( ["\\\\/bfnrt] | "u" [0-9a-fA-F]{4} )',
    "number": '"-"? integral ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?',
    "integral": '"0" | [1-9] [0-9]{0,15}',
    "boolean": '"true" | "false"',
    "null": '"null"',
}


def rules(grammar: str) -> dict[str, str]:
    out = {}
    for line in grammar.strip().splitlines():
        name, _, body = line.partition(" ::= ")
        out[name] = body
    return out


def test_literal_escaping() -> None:
    assert gbnf_literal('a"b\\c\nd\te\x01') == '"a\\"b\\\\c\\nd\\te\\x01"'


def test_json_object_grammar() -> None:
    assert rules(json_object_grammar()) == {
        "root": "object",
        **{
            k: PRIMITIVES[k]
            for k in (
                "object",
                "string",
                "char",
                "value",
                "array",
                "number",
                "integral",
                "boolean",
                "null",
            )
        },
    }


def test_object_schema_required_then_optional_properties() -> None:
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "enum": ["Paris", "Oslo"]},
            "days": {"type": "integer"},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
        },
        "required": ["city"],
    }
    got = rules(json_schema_grammar(schema))
    assert got["root"] == "root-value"
    assert got["root-value-city"] == '"\\"Paris\\"" | "\\"Oslo\\""'
    assert got["root-value-city-kv"] == '"\\"city\\"" ": " root-value-city'
    assert got["root-value-days-kv"] == '"\\"days\\"" ": " integer'
    assert got["root-value-tags"] == '"[" ( string ( ", " string ){0,2} )? "]"'
    assert got["root-value-days-rest"] == '( ", " ( root-value-tags-kv ) )?'
    assert got["root-value"] == (
        '"{" root-value-city-kv ( ", " ( root-value-days-kv root-value-days-rest | root-value-tags-kv ) )? "}"'
    )


def test_refs_anyof_and_const() -> None:
    schema = {
        "$defs": {"n": {"type": "number"}},
        "anyOf": [{"$ref": "#/$defs/n"}, {"const": "auto"}],
    }
    got = rules(json_schema_grammar(schema))
    assert got["root-value"] == "ref-defs-n | root-value-1"
    assert got["ref-defs-n"] == "number"
    assert got["root-value-1"] == '"\\"auto\\""'


def test_items_as_a_list_is_a_tuple_as_llama_cpp_reads_it() -> None:
    """Draft-04 tuple form (llama.cpp's test_chat_completion response_format1): an array
    of exactly those items, like prefixItems; `items` alone implies an array."""
    tuple_form = rules(json_schema_grammar({"items": [{"type": "integer"}, {"const": "a"}]}))
    assert tuple_form["root-value"] == '"[" integer ", " root-value-1 "]"'
    assert tuple_form["root-value-1"] == '"\\"a\\""'
    prefix = rules(json_schema_grammar({"type": "array", "prefixItems": [{"type": "integer"}]}))
    assert prefix["root-value"] == '"[" integer "]"'
    assert rules(json_schema_grammar({"items": {"type": "null"}}))["root-value"] == (
        '"[" ( null ( ", " null )* )? "]"'
    )
    with pytest.raises(InvalidRequestError, match="#/items/1: a schema must be an object"):
        json_schema_grammar({"items": [{"type": "integer"}, 5]})


def test_bad_schemas_are_invalid_requests() -> None:
    with pytest.raises(InvalidRequestError):
        json_schema_grammar({"$ref": "https://example.com/schema.json"})
    with pytest.raises(InvalidRequestError):
        json_schema_grammar({"enum": []})
    with pytest.raises(InvalidRequestError):
        json_schema_grammar({"type": "object", "properties": ["a"]})


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "enum": ["Paris"]}},
                "required": ["city"],
            },
        },
    },
    {"type": "function", "function": {"name": "get_time"}},
]


def test_hermes_forced_call_grammar() -> None:
    got = rules(tool_call_grammar(ToolFormat.HERMES, TOOLS, only="get_weather"))
    assert got["root"] == "tool-call"
    assert got["tool-call"] == '"<tool_call>\\n" call "\\n</tool_call>"'
    assert got["call"] == '"{\\"name\\": " "\\"get_weather\\"" ", \\"arguments\\": " fn0-args "}"'
    assert got["fn0-args"] == '"{" fn0-args-city-kv "}"'


def test_required_choice_offers_every_tool() -> None:
    got = rules(tool_call_grammar(ToolFormat.MISTRAL, TOOLS))
    assert got["root"] == '"[TOOL_CALLS][" call "]"'
    assert got["call"].count("|") == 1
    parallel = rules(tool_call_grammar(ToolFormat.HERMES, TOOLS, parallel=True))
    assert parallel["root"] == 'tool-call ( "\\n" tool-call )*'
    llama = rules(tool_call_grammar(ToolFormat.LLAMA3_JSON, TOOLS, parallel=True))
    assert llama["root"] == 'call ( "; " call )*'
    assert llama["call"].startswith('"{\\"name\\": " "\\"get_weather\\"" ", \\"parameters\\": "')


@pytest.mark.parametrize("fmt", list(ToolFormat))
def test_rendered_call_text_parses_back(fmt: ToolFormat) -> None:
    text = render_tool_call(fmt, "get_weather", {"city": "Paris", "days": 2})
    parsed = parse_tool_calls(text, fmt, TOOLS)
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [
        ("get_weather", '{"city": "Paris", "days": 2}')
    ]
    assert parsed.content == ""
