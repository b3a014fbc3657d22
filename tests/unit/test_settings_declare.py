"""One declaration per setting: a settings field carries its flag, and the parser, the
environment binding, `--help` and the doc table are built from the record alone."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from enum import Enum

import pytest

from kvmem.cli import flag_doc
from kvmem.cli.env_args import MISSING, read_env_value
from kvmem.cli.flag_parser import FlagArgumentParser, add_flags, bindings_of
from kvmem.cli.kv_cache_flags import KVCacheFlags
from kvmem.cli.kvmem_flags import KVMemFlags, kvmem_config_from_args
from kvmem.cli.spec_flags import spec_config_from_args
from kvmem.config import KVCacheTypes, KVMemConfig
from kvmem.errors import ConfigError
from kvmem.settings import Group, Program, flags_of, from_values, setting
from kvmem.settings.values import int32
from kvmem.spec_config import SpecConfig


class Shape(Enum):
    ROUND = "round"
    SQUARE = "square"


@dataclass(frozen=True, slots=True)
class WidgetSettings:
    """A record with one new `--kvmem-*` setting: the only place the flag is written."""

    widgets: int = setting(
        4, "--kvmem-widgets", help="widgets kept warm", parse=int32, env="KVMEM_WIDGETS",
        metavar="N", programs=Program.BOTH, group=Group.KVMEM,
    )  # fmt: skip
    shape: Shape = setting(Shape.ROUND, "--kvmem-shape", help="widget shape", group=Group.KVMEM)


def _parser() -> FlagArgumentParser:
    parser = FlagArgumentParser(prog="t", add_help=False)
    add_flags(parser, flags_of(WidgetSettings, "kvmem_"), fill_defaults=True)
    return parser


def test_the_new_field_makes_the_flag_parse() -> None:
    ns = _parser().parse_args(["--kvmem-widgets", "9", "--kvmem-shape", "square"])
    assert (ns.kvmem_widgets, ns.kvmem_shape) == (9, "square")
    built = from_values(WidgetSettings, ns, "kvmem_")
    assert built == WidgetSettings(widgets=9, shape=Shape.SQUARE)
    assert from_values(WidgetSettings, _parser().parse_args([]), "kvmem_") == WidgetSettings()


def test_the_new_flag_keeps_the_int32_range_and_the_choices() -> None:
    with pytest.raises(ConfigError) as exc:
        _parser().parse_args(["--kvmem-widgets", "2147483648"])
    assert str(exc.value) == (
        "argument --kvmem-widgets: 2147483648 is out of range: must be in -2147483648..2147483647"
    )
    with pytest.raises(ConfigError) as exc:
        _parser().parse_args(["--kvmem-shape", "oval"])
    assert str(exc.value) == (
        "argument --kvmem-shape: invalid choice: 'oval' (choose from 'round', 'square')"
    )


def test_the_new_flag_binds_its_environment_variable() -> None:
    (binding,) = bindings_of(flags_of(WidgetSettings, "kvmem_"))
    assert (binding.name, binding.dest) == ("KVMEM_WIDGETS", "kvmem_widgets")
    assert read_env_value(binding, {"KVMEM_WIDGETS": "7"}) == 7
    assert read_env_value(binding, {}) is MISSING
    with pytest.raises(ConfigError) as exc:
        read_env_value(binding, {"KVMEM_WIDGETS": "1.5"})
    assert str(exc.value) == "KVMEM_WIDGETS: invalid integer value: '1.5'"


def test_the_new_flag_is_in_its_help_group_and_the_doc_table() -> None:
    help_text = _parser().format_help()
    section = help_text[help_text.index("KVMem memory:") :]
    assert "--kvmem-widgets N" in section and "widgets kept warm (default: 4)" in section
    lines = flag_doc.table(flags_of(WidgetSettings, "kvmem_"))
    assert lines[1:] == [
        "| `--kvmem-widgets` | widgets kept warm | 4 | `KVMEM_WIDGETS` | active; kvmem-cli too |",
        "| `--kvmem-shape` | widget shape (round, square) | round |  | active |",
    ]


def test_the_real_records_defaults_are_their_flags_defaults() -> None:
    ns = argparse.Namespace()
    rows = flags_of(KVMemConfig, "kvmem_") + flags_of(KVCacheFlags) + flags_of(SpecConfig, "spec_")
    for row in rows:
        setattr(ns, row.dest, row.default)
    assert kvmem_config_from_args(ns) == KVMemFlags(KVMemConfig(), KVCacheTypes())
    assert spec_config_from_args(ns) == SpecConfig()
    budget = next(r for r in flags_of(KVMemConfig, "kvmem_") if r.dest == "kvmem_budget")
    assert (budget.flags, budget.default, budget.group) == (("--kvmem-budget",), 32768, Group.KVMEM)
