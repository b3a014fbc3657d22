"""llama-server launch-line parity: no-op switches, flags with meanings, rejected flags."""

from __future__ import annotations

import pytest

from kvmem.chat.builtin_templates import BUILTIN_TEMPLATES
from kvmem.chat.template import ChatTemplate
from kvmem.cli.compat_flags import NOOP_SWITCHES, REJECTED_FLAGS
from kvmem.cli.server_config import load_server_settings
from kvmem.errors import ConfigError

# What the llama.cpp server test suite passes on every launch (utils.py).
STOCK_LINE = [
    "--port", "8080", "--temp", "0.8", "--seed", "42", "--host", "127.0.0.1",
    "--batch-size", "32", "--no-slots", "--alias", "tinyllama-2", "--ctx-size", "512",
    "--parallel", "2", "--n-predict", "64", "--no-jinja",
]  # fmt: skip


def load(*argv: str) -> tuple[object, list[str]]:
    return load_server_settings(list(argv), {})


def test_stock_llama_server_line_starts_two_lanes_without_a_parallel_warning() -> None:
    settings, warnings = load(*STOCK_LINE)
    assert settings.slots_endpoint is False
    assert settings.engine.n_ctx == 512 and settings.n_predict == 64
    assert settings.parallel == 2  # type: ignore[attr-defined]
    assert [w for w in warnings if w.startswith("--parallel")] == []
    assert load("--parallel", "1")[1] == []


def _valid_value(spec) -> list[str]:
    if not spec.takes_value:
        return []
    return ["on"] if spec.metavar == "on|off|auto" else ["1"]


@pytest.mark.parametrize(
    ("flag", "spec"), [(f, spec) for spec in NOOP_SWITCHES for f in spec.flags]
)
def test_noop_flags_are_accepted(flag: str, spec) -> None:
    settings, warnings = load(flag, *_valid_value(spec))
    assert warnings == []
    assert settings.engine.n_ctx == 0  # nothing else changed
    assert settings == load()[0]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--keep", "-2"], "--keep: -2 is out of range: must be in -1..2147483647"),
        (["--keep", "2147483648"], "--keep: 2147483648 is out of range: must be in -1..2147483647"),
        (["--cache-reuse", "x"], "--cache-reuse: invalid integer value: 'x'"),
        (["-ctxcp", "-1"], "-ctxcp: -1 is out of range: must be in 0..2147483647"),
        (["-sps", "1.5"], "-sps: 1.5 is out of range [0.0, 1.0]"),
        (["--log-colors", "rainbow"], "--log-colors: invalid value 'rainbow': use on, off or auto"),
        (
            ["--sse-ping-interval", "-5"],
            "--sse-ping-interval: -5 is out of range: must be in -1..2147483647",
        ),
    ],
)
def test_noop_flags_check_their_values(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(*argv)
    assert str(info.value) == message


def test_log_colors_value_is_optional() -> None:
    assert load("--log-colors")[0] == load()[0]
    assert load("--log-colors", "-c", "64")[0].engine.n_ctx == 64


def test_noop_flags_say_so_in_help(capsys: pytest.CaptureFixture[str]) -> None:
    from kvmem.cli.server_args import build_server_parser

    with pytest.raises(SystemExit):
        build_server_parser().parse_args(["--help"])
    text = capsys.readouterr().out
    section = text[text.index("llama-server compatibility: accepted, no effect:") :]
    section = section[: section.index("llama-server compatibility: rejected:")]
    for spec in NOOP_SWITCHES:
        assert spec.flags[0] in section
    assert section.count("accepted, no effect:") == 1 + len(NOOP_SWITCHES)  # title + rows


@pytest.mark.parametrize("spec", REJECTED_FLAGS, ids=lambda s: s.flags[-1])
def test_rejected_flags_say_why(spec) -> None:
    for flag in spec.flags:
        argv = [flag, "x"] if spec.takes_value else [flag]
        with pytest.raises(ConfigError) as info:
            load(*argv)
        assert str(info.value) == f"{flag}: {spec.reason}"


def test_slots_verbose_and_reasoning_format() -> None:
    assert load()[0].slots_endpoint is True
    assert load("--slots")[0].slots_endpoint is True
    assert load("--no-slots")[0].slots_endpoint is False
    assert load("-v")[0].verbosity == 5
    assert load("--verbose", "-lv", "2")[0].verbosity == 2
    assert load()[0].reasoning_format == "auto"
    assert load("--reasoning-format", "none")[0].reasoning_format == "none"
    with pytest.raises(ConfigError, match="invalid reasoning format 'think'"):
        load("--reasoning-format", "think")


def test_comma_separated_host() -> None:
    settings = load("--host", "127.0.0.1, ::1")[0]
    assert settings.host == "127.0.0.1,::1"
    assert settings.hosts == ("127.0.0.1", "::1")
    with pytest.raises(ConfigError, match="an address is empty"):
        load("--host", "127.0.0.1,")


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (
            "chatml",
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
            "<|im_start|>assistant\n",
        ),
        (
            "llama3",
            "<|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nU<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n",
        ),
        ("llama2", "[INST] <<SYS>>\nS\n<</SYS>>\n\nU [/INST]"),
        ("mistral-v7", "[SYSTEM_PROMPT]S[/SYSTEM_PROMPT][INST]U[/INST]"),
        ("gemma", "<start_of_turn>user\nS\n\nU<end_of_turn>\n<start_of_turn>model\n"),
        ("phi3", "<|system|>\nS<|end|>\n<|user|>\nU<|end|>\n<|assistant|>\n"),
        (
            "command-r",
            "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>S<|END_OF_TURN_TOKEN|>"
            "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>U<|END_OF_TURN_TOKEN|>"
            "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
        ),
        ("deepseek", "S\n\nUser: U\n\nAssistant:"),
        ("deepseek3", "S<｜User｜>U<｜Assistant｜>"),
    ],
)
def test_builtin_template_names(name: str, expected: str) -> None:
    assert name in BUILTIN_TEMPLATES
    settings = load("--chat-template", name)[0]
    template = ChatTemplate(settings.chat_template, bos_token="<s>", eos_token="</s>")
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    assert template.render(messages, add_generation_prompt=True) == expected


def test_builtin_templates_leave_the_bos_to_the_tokenizer_as_llama_cpp() -> None:
    """llama.cpp's built-ins write no leading BOS (llama.cpp's test_apply_chat_template,
    command-r); Llama 2 writes it before the later turns only."""
    messages = [
        {"role": "user", "content": "A"},
        {"role": "assistant", "content": "B"},
        {"role": "user", "content": "C"},
    ]
    llama2 = ChatTemplate(BUILTIN_TEMPLATES["llama2"], bos_token="<s>", eos_token="</s>")
    assert llama2.render(messages, add_generation_prompt=True) == (
        "[INST] A [/INST] B </s><s>[INST] C [/INST]"
    )
    for name, source in BUILTIN_TEMPLATES.items():
        rendered = ChatTemplate(source, bos_token="<s>", eos_token="</s>").render(
            messages[:1], add_generation_prompt=True
        )
        assert not rendered.startswith("<s>"), name


def test_unknown_template_name_lists_the_builtins() -> None:
    with pytest.raises(ConfigError) as info:
        load("--chat-template", "vicuna-orca")
    assert "chatml, command-r, deepseek, deepseek3, gemma, llama2, llama3, mistral-v7, phi3" in str(
        info.value
    )


def test_reasoning_format_none_keeps_thinking_in_content() -> None:
    import asyncio

    from kvmem.server.channel import EventChannel
    from kvmem.server.chat_job import prepare_chat_job
    from kvmem.server.schemas import parse_chat_request

    source = (
        "{%- for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] }}"
        "{%- endfor %}{{ '<|im_start|>assistant\\n<think>\\n' }}"
    )
    template = ChatTemplate(source)
    request = parse_chat_request({"messages": [{"role": "user", "content": "hi"}]})
    channel = EventChannel(asyncio.new_event_loop())
    auto = prepare_chat_job(request, load()[0], template, channel)
    assert auto.reasoning is not None and auto.rendered.opens_reasoning
    none = prepare_chat_job(request, load("--reasoning-format", "none")[0], template, channel)
    assert none.reasoning is None and not none.rendered.opens_reasoning
    with pytest.raises(ConfigError, match="'deepseek-legacy'.*is not supported"):
        load("--reasoning-format", "deepseek-legacy")


def test_thinking_off_closes_a_block_the_template_always_opens() -> None:
    from kvmem.chat.prompt import render_prompt

    source = "{{ messages[0]['content'] }}<｜Assistant｜>{{ '<think>\\n' }}"
    template = ChatTemplate(source)
    messages = [{"role": "user", "content": "hi"}]
    on = render_prompt(template, messages, template_kwargs={"enable_thinking": True})
    assert on.text.endswith("<think>\n") and on.opens_reasoning
    off = render_prompt(template, messages, template_kwargs={"enable_thinking": False})
    assert off.text == "hi<｜Assistant｜><think>\n</think>" and not off.opens_reasoning


def test_reasoning_auto_turns_thinking_on_where_the_template_offers_it() -> None:
    from kvmem.chat.prompt import render_prompt

    source = "{{ '<think>\\n' }}{% if not enable_thinking %}{{ '</think>' }}{% endif %}"
    template = ChatTemplate(source)
    messages = [{"role": "user", "content": "hi"}]
    assert render_prompt(template, messages).text == "<think>\n"
    off = render_prompt(template, messages, template_kwargs={"enable_thinking": False})
    assert off.text == "<think>\n</think>"
