"""--no-kvmem with a `--kvmem-*` tuning flag: refused before the model loads, never ignored."""

from __future__ import annotations

import argparse
from dataclasses import fields

import pytest

from kvmem.bench.engines import Method, add_engine_arguments
from kvmem.bench.engines import settings_from_args as bench_settings
from kvmem.cli.chat_cli import build_parser
from kvmem.cli.chat_cli import settings_from_args as cli_settings
from kvmem.cli.server_config import load_server_settings
from kvmem.config import KVMemConfig
from kvmem.errors import ConfigError
from kvmem.settings import declared_fields

TUNING = [
    (["--kvmem-budget", "2048"], "--kvmem-budget"),
    (["--kvmem-gen-reserve", "256"], "--kvmem-gen-reserve"),
    (["--kvmem-stream-tokens", "1024"], "--kvmem-stream-tokens"),
    (["--kvmem-recompute", "retrieved"], "--kvmem-recompute"),
    (["--kvmem-positions", "original"], "--kvmem-positions"),
    (["--kvmem-query-source", "scoring"], "--kvmem-query-source"),
    (["--kvmem-harness-overflow", "fallback"], "--kvmem-harness-overflow"),
]


@pytest.mark.parametrize(("argv", "flag"), TUNING)
def test_the_server_refuses_a_tuning_flag_with_no_kvmem(argv: list[str], flag: str) -> None:
    assert load_server_settings(argv, {})[0].engine.kvmem.enabled is True  # alone: fine
    with pytest.raises(ConfigError) as info:
        load_server_settings([*argv, "--no-kvmem"], {})
    assert info.value.flag == flag
    assert "tunes KVMem, which --no-kvmem turns off" in str(info.value)


@pytest.mark.parametrize(
    "argv",
    [
        ["--no-kvmem"],
        ["--no-kvmem", "--kvmem-trace"],
        ["--no-kvmem", "--kvmem-budget", str(KVMemConfig().budget)],  # the default changes nothing
    ],
)
def test_no_kvmem_alone_or_with_the_trace_loads(argv: list[str]) -> None:
    kv = load_server_settings(argv, {})[0].engine.kvmem
    assert (kv.enabled, kv.budget) == (False, KVMemConfig().budget)


def test_every_setting_has_a_flag_the_check_can_name() -> None:
    assert {name for name, _ in declared_fields(KVMemConfig)} == {
        f.name for f in fields(KVMemConfig)
    }


def test_kvmem_cli_refuses_it_too() -> None:
    ns = build_parser().parse_args(["-p", "x", "--no-kvmem", "--kvmem-stream-tokens", "1024"])
    with pytest.raises(ConfigError) as info:
        cli_settings(ns)
    assert info.value.flag == "--kvmem-stream-tokens"


def test_kvmem_bench_refuses_the_switch_its_methods_set() -> None:
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser, [Method.FULL, Method.RETRIEVAL])
    with pytest.raises(ConfigError) as info:
        bench_settings(parser.parse_args(["--no-kvmem"]))
    assert info.value.flag == "--no-kvmem" and "--methods full" in str(info.value)
    assert bench_settings(parser.parse_args([])).kvmem.budget == 1024
