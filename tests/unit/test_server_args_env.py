"""LLAMA_ARG_* environment variables: precedence, validation, unknown and forbidden names."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvmem.cli.server_args import parse_server_argv
from kvmem.cli.server_config import load_server_settings
from kvmem.errors import ConfigError
from kvmem.server.settings import Source


def test_precedence_cli_over_env_over_default() -> None:
    env = {"LLAMA_ARG_CTX_SIZE": "4096", "LLAMA_ARG_PORT": "9001", "LLAMA_ARG_N_PREDICT": "64"}
    s, _ = load_server_settings(["--port", "9100"], env)
    assert (s.engine.n_ctx, s.port, s.n_predict, s.engine.n_batch) == (4096, 9100, 64, 2048)
    assert (s.sources["ctx_size"], s.sources["port"], s.sources["batch_size"]) == (
        Source.ENV,
        Source.CLI,
        Source.DEFAULT,
    )


def test_env_values_are_validated_even_when_the_cli_overrides_them() -> None:
    with pytest.raises(ConfigError) as info:
        load_server_settings(["-c", "2048"], {"LLAMA_ARG_CTX_SIZE": "lots"})
    assert str(info.value).startswith("LLAMA_ARG_CTX_SIZE: invalid integer value")


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("LLAMA_ARG_CTX_SIZE", "0"),
        ("LLAMA_ARG_N_PREDICT", "0"),
        ("LLAMA_ARG_PORT", "99999"),
        ("LLAMA_ARG_N_PARALLEL", "x"),
        ("LLAMA_ARG_FLASH_ATTN", "sometimes"),
        ("LLAMA_ARG_N_GPU_LAYERS", "-9"),
        ("LLAMA_ARG_UI", "maybe"),
        ("LLAMA_ARG_ENDPOINT_METRICS", "2"),
        ("LLAMA_ARG_LOG_VERBOSITY", "9"),
        ("LLAMA_ARG_CHAT_TEMPLATE_KWARGS", "nope"),
        ("LLAMA_ARG_THINK_BUDGET", "-3"),
        ("LLAMA_ARG_CACHE_TYPE_K", "q3_k"),
        ("LLAMA_ARG_TOP_P", "2"),
        ("LLAMA_ARG_SPLIT_MODE", "row,layer"),
    ],
)
def test_invalid_env_values_fail_naming_the_variable(name: str, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_server_settings([], {name: value})
    assert str(info.value).startswith(f"{name}:")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("1", True),
        ("0", False),
        ("true", True),
        ("FALSE", False),
        ("on", True),
        ("Off", False),
        ("yes", True),
        ("no", False),
    ],
)
def test_boolean_env_values(value: str, expected: bool) -> None:
    s, _ = load_server_settings([], {"LLAMA_ARG_ENDPOINT_METRICS": value, "LLAMA_ARG_UI": value})
    assert (s.metrics, s.ui) == (expected, expected)


def test_negated_boolean_env_and_cli_override_of_ui() -> None:
    assert load_server_settings([], {"LLAMA_ARG_NO_UI": "1"})[0].ui is False
    assert load_server_settings(["--ui"], {"LLAMA_ARG_UI": "false"})[0].ui is True
    assert parse_server_argv(["--no-mmproj-offload"], {}).values["mmproj_offload"] is False


def test_unknown_llama_arg_names_warn_without_values() -> None:
    env = {"LLAMA_ARG_CONT_BATCHING": "s3cr3t-value", "LLAMA_ARG_WHATEVER": "x", "OTHER_VAR": "1"}
    _, warnings = load_server_settings([], env)
    assert warnings == [
        "ignoring unsupported environment variable LLAMA_ARG_CONT_BATCHING",
        "ignoring unsupported environment variable LLAMA_ARG_WHATEVER",
    ]
    assert not any("s3cr3t" in w for w in warnings)


@pytest.mark.parametrize(
    "name",
    [
        "LLAMA_ARG_SSL_KEY_FILE",
        "LLAMA_ARG_SSL_CERT_FILE",
        "LLAMA_ARG_API_KEY",
        "LLAMA_API_KEY_FILE",
        "LLAMA_ARG_API_KEYS",
        "LLAMA_ARG_TLS_CERT",
    ],
)
def test_unsupported_key_and_tls_names_fail_startup(name: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_server_settings([], {name: "sk-secret"})
    assert str(info.value).startswith(f"{name}:")
    assert "sk-secret" not in str(info.value)


def test_env_keys_add_to_cli_keys(tmp_path: Path) -> None:
    key_file = tmp_path / "keys.txt"
    key_file.write_bytes(b"# team keys\r\nsk-file-1\r\n\r\nsk-file-2\r\n")
    cli_file = tmp_path / "cli.txt"
    cli_file.write_text("sk-cli-file\n")
    env = {"LLAMA_API_KEY": "sk-env-1,sk-env-2", "LLAMA_ARG_API_KEY_FILE": str(key_file)}
    s, _ = load_server_settings(
        ["--api-key", "sk-cli", "--api-key", "sk-cli-2", "--api-key-file", str(cli_file)], env
    )
    assert s.api_keys.keys == (
        "sk-env-1",
        "sk-env-2",
        "sk-cli",
        "sk-cli-2",
        "sk-file-1",
        "sk-file-2",
        "sk-cli-file",
    )
    assert "sk-" not in repr(s) and "sk-" not in repr(s.api_keys)


def test_invalid_env_key_does_not_echo_it() -> None:
    with pytest.raises(ConfigError) as info:
        load_server_settings([], {"LLAMA_API_KEY": "bad key"})
    assert "bad key" not in str(info.value)
    assert str(info.value).startswith("LLAMA_API_KEY:")


def test_trace_from_env_and_cli_override() -> None:
    assert load_server_settings([], {"KVMEM_TRACE": "1"})[0].trace is True
    assert load_server_settings([], {"KVMEM_TRACE": "0"})[0].trace is False
    assert load_server_settings([], {"KVMEM_TRACE": ""})[0].trace is False
    assert load_server_settings(["--no-kvmem-trace"], {"KVMEM_TRACE": "1"})[0].trace is False
    assert load_server_settings(["--kvmem-trace"], {})[0].trace is True


def test_env_cache_types_and_cli_precedence() -> None:
    env = {"LLAMA_ARG_CACHE_TYPE_K": "q8_0", "LLAMA_ARG_CACHE_TYPE_V": "q8_0"}
    s, _ = load_server_settings([], env)
    assert (s.engine.cache_types.k.label, s.engine.cache_types.v.label) == ("q8_0", "q8_0")
    s, _ = load_server_settings(["-ctv", "q4_0"], env)
    assert (s.engine.cache_types.k.label, s.engine.cache_types.v.label) == ("q8_0", "q4_0")
