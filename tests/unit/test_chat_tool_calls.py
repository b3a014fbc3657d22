"""Tool-call parsing with real model-format outputs, for every supported format."""

from __future__ import annotations

import json
import re

from kvmem.chat.tool_calls import ToolFormat, detect_tool_format, parse_tool_calls

WEATHER_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                    "metric": {"type": "boolean"},
                    "zip": {"type": "string"},
                },
            },
        },
    }
]


def calls(
    text: str, fmt: ToolFormat, tools: list | None = None
) -> tuple[str, list[tuple[str, dict]]]:
    parsed = parse_tool_calls(text, fmt, tools)
    return parsed.content, [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls]


def test_hermes_qwen_several_calls_in_one_turn() -> None:
    text = (
        "<tool_call>\n"
        '{"name": "get_current_temperature", "arguments": {"location": "San Francisco, CA, USA", "unit": "celsius"}}\n'
        "</tool_call>\n"
        "<tool_call>\n"
        '{"name": "get_temperature_date", "arguments": {"location": "San Francisco, CA, USA", '
        '"date": "2024-10-01", "unit": "celsius"}}\n'
        "</tool_call>"
    )
    assert calls(text, ToolFormat.HERMES) == (
        "",
        [
            ("get_current_temperature", {"location": "San Francisco, CA, USA", "unit": "celsius"}),
            (
                "get_temperature_date",
                {"location": "San Francisco, CA, USA", "date": "2024-10-01", "unit": "celsius"},
            ),
        ],
    )


def test_hermes_with_leading_content_and_string_arguments() -> None:
    text = 'I will check.\n<tool_call>\n{"name": "f", "arguments": "{\\"a\\": 1}"}\n</tool_call>'
    assert calls(text, ToolFormat.HERMES) == ("I will check.", [("f", {"a": 1})])


def test_hermes_unterminated_final_call_still_parses() -> None:
    text = '<tool_call>\n{"name": "f", "arguments": {}}'
    assert calls(text, ToolFormat.HERMES) == ("", [("f", {})])


def test_hermes_closing_tag_cut_by_max_tokens() -> None:
    text = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_ca'
    assert calls(text, ToolFormat.HERMES) == ("", [("f", {"a": 1})])


def test_hermes_invalid_json_stays_content() -> None:
    text = '<tool_call>\n{"name": "f", "arguments": {broken}\n</tool_call>'
    assert calls(text, ToolFormat.HERMES) == (text, [])


def test_hermes_call_ids_are_unique_openai_style() -> None:
    text = '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b", "arguments": {}}</tool_call>'
    parsed = parse_tool_calls(text, ToolFormat.HERMES)
    ids = [c.id for c in parsed.tool_calls]
    assert len(set(ids)) == 2
    assert all(re.fullmatch(r"call_[A-Za-z0-9]{24}", i) for i in ids)


def test_qwen3_coder_xml_types_parameters_from_the_schema() -> None:
    text = (
        "<tool_call>\n<function=get_weather>\n"
        "<parameter=city>\nSan Francisco\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n"
        "<parameter=metric>\ntrue\n</parameter>\n"
        "<parameter=zip>\n94103\n</parameter>\n"
        "</function>\n</tool_call>"
    )
    assert calls(text, ToolFormat.QWEN3_CODER, WEATHER_TOOLS) == (
        "",
        [("get_weather", {"city": "San Francisco", "days": 3, "metric": True, "zip": "94103"})],
    )


def test_qwen3_coder_two_calls_and_unknown_function_without_schema() -> None:
    text = (
        "Checking both.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "</function>\n</tool_call>\n<tool_call>\n<function=lookup>\n<parameter=ids>\n[1, 2]\n</parameter>\n"
        "<parameter=note>\nmulti\nline\n</parameter>\n</function>\n</tool_call>"
    )
    assert calls(text, ToolFormat.QWEN3_CODER, WEATHER_TOOLS) == (
        "Checking both.",
        [("get_weather", {"city": "Paris"}), ("lookup", {"ids": [1, 2], "note": "multi\nline"})],
    )


def test_qwen3_coder_function_without_tool_call_wrapper() -> None:
    text = "<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>"
    assert calls(text, ToolFormat.QWEN3_CODER, WEATHER_TOOLS) == (
        "",
        [("get_weather", {"city": "Oslo"})],
    )


def test_llama3_json_call() -> None:
    text = '{"name": "get_current_conditions", "parameters": {"location": "San Francisco, CA", "unit": "Fahrenheit"}}'
    assert calls(text, ToolFormat.LLAMA3_JSON) == (
        "",
        [("get_current_conditions", {"location": "San Francisco, CA", "unit": "Fahrenheit"})],
    )


def test_llama3_python_tag_and_several_calls() -> None:
    text = (
        '<|python_tag|>{"name": "a", "parameters": {"x": 1}}; {"name": "b", "arguments": {"y": 2}}'
    )
    assert calls(text, ToolFormat.LLAMA3_JSON) == ("", [("a", {"x": 1}), ("b", {"y": 2})])


def test_llama3_plain_text_or_non_call_json_is_content() -> None:
    assert calls("The weather is fine.", ToolFormat.LLAMA3_JSON) == ("The weather is fine.", [])
    assert calls('{"answer": 42}', ToolFormat.LLAMA3_JSON) == ('{"answer": 42}', [])


def test_mistral_v3_json_array_keeps_ids() -> None:
    text = (
        '[TOOL_CALLS] [{"name": "get_current_weather", "arguments": {"location": "Paris, France", '
        '"format": "celsius"}, "id": "abcDEF123"}, {"name": "get_time", "arguments": {}, "id": "xyz987UVW"}]'
    )
    parsed = parse_tool_calls(text, ToolFormat.MISTRAL)
    assert parsed.content == ""
    assert [(c.id, c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == [
        ("abcDEF123", "get_current_weather", {"location": "Paris, France", "format": "celsius"}),
        ("xyz987UVW", "get_time", {}),
    ]


def test_mistral_v11_name_args_format() -> None:
    text = '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{"tz": "CET"}'
    assert calls(text, ToolFormat.MISTRAL) == (
        "",
        [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "CET"})],
    )


def test_mistral_malformed_is_content() -> None:
    text = "[TOOL_CALLS] [{not json"
    assert calls(text, ToolFormat.MISTRAL) == (text, [])


def test_format_detection_from_template_source() -> None:
    assert (
        detect_tool_format("{{- '<tool_call>\\n<function=' + tool_call.name }}")
        is ToolFormat.QWEN3_CODER
    )
    assert detect_tool_format('{{- \'<tool_call>\\n{"name": "\' }}') is ToolFormat.HERMES
    assert detect_tool_format("{{ '[TOOL_CALLS]' }}") is ToolFormat.MISTRAL
    assert (
        detect_tool_format("<|start_header_id|>ipython<|end_header_id|>") is ToolFormat.LLAMA3_JSON
    )
    assert detect_tool_format("<|im_start|>{{ message.content }}") is ToolFormat.HERMES
