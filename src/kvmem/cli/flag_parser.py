"""argparse parsers, `--help` and environment bindings, generated from the flag rows
(the settings records' declared fields and the compatibility table: kvmem.cli.flag_table).

`build_parser(program)` adds every row the program uses, grouped as in `--help`:
ACTIVE rows with their parser, NOOP rows as accepted switches, REJECTED rows as actions
that raise `ConfigError(flag, reason)` when seen. `resolve` applies CLI > environment >
default to a parsed namespace and records where each value came from.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from typing import Any

from kvmem.cli.env_args import EnvBinding
from kvmem.cli.flag_table import flags_for
from kvmem.errors import ConfigError
from kvmem.settings.flag import SOURCED_GROUPS, Flag, Group, Program, Status


class FlagArgumentParser(argparse.ArgumentParser):
    """argparse that raises ConfigError instead of exiting, so main() reports it once."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError("", message)


class _Reject(argparse.Action):
    def __init__(self, option_strings: list[str], dest: str, reason: str, **kwargs: object):
        self.reason = reason
        super().__init__(option_strings, dest, **kwargs)  # type: ignore[arg-type]

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[no-untyped-def]
        raise ConfigError(option_string or self.option_strings[0], self.reason)


class _NoOp(argparse.Action):
    """An accepted flag without an effect: its value (if any) is checked by the row's
    parser, then the flag's name is recorded in `compat_noop`."""

    def __init__(self, option_strings: list[str], dest: str, row: Flag, **kwargs: object):
        self.row = row
        super().__init__(option_strings, dest, **kwargs)  # type: ignore[arg-type]

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[no-untyped-def]
        flag = option_string or self.option_strings[0]
        if isinstance(values, str) and self.row.parse is not None:
            try:
                self.row.parse(values)
            except argparse.ArgumentTypeError as exc:
                raise ConfigError(flag, str(exc)) from None
        seen = list(getattr(namespace, self.dest, None) or [])
        setattr(namespace, self.dest, [*seen, flag])


def help_text(row: Flag, show_env: bool = True) -> str:
    env = f"; env: {row.env}" if row.env and show_env else ""
    return f"{row.help} (default: {row.shown()}{env})".replace("%", "%%")


def _add(group: argparse._ArgumentGroup, row: Flag, fill_defaults: bool, show_env: bool) -> None:
    default = row.default if fill_defaults else argparse.SUPPRESS
    if row.status is Status.NOOP:
        group.add_argument(
            *row.flags,
            dest=row.dest,
            action=_NoOp,
            row=row,
            nargs=("?" if row.optional_value else None) if row.takes_value else 0,
            metavar=(row.metavar or "X") if row.takes_value else None,
            default=argparse.SUPPRESS,
            help=f"accepted, no effect: {row.reason.removeprefix('no-op: ')}",
        )
    elif row.status is Status.REJECTED:
        group.add_argument(
            *row.flags,
            dest=row.dest,
            action=_Reject,
            reason=row.reason,
            nargs=1 if row.takes_value else 0,
            metavar="X" if row.takes_value else None,
            default=argparse.SUPPRESS,
            help=row.help,
        )
    elif row.is_switch:
        group.add_argument(
            *row.flags, dest=row.dest, action="store_const", const=True, default=default,
            help=help_text(row, show_env),
        )  # fmt: skip
        if row.negative:
            group.add_argument(
                *row.negative, dest=row.dest, action="store_const", const=False,
                default=default, help=f"disable {row.flags[-1]}",
            )  # fmt: skip
    else:
        group.add_argument(
            *row.flags,
            dest=row.dest,
            type=row.parse,
            choices=list(row.choices) or None,
            metavar=row.metavar,
            action="append" if row.append else "store",
            default=default,
            help=help_text(row, show_env),
        )


def add_flags(
    parser: argparse.ArgumentParser,
    rows: tuple[Flag, ...],
    *,
    fill_defaults: bool,
    show_env: bool = False,
) -> None:
    """Add `rows` to `parser` in their `--help` groups, in the groups' order."""
    groups: dict[Group, argparse._ArgumentGroup] = {}
    for group in Group:
        members = [r for r in rows if r.group is group]
        if not members:
            continue
        groups[group] = parser.add_argument_group(group.value)
        for row in members:
            _add(groups[group], row, fill_defaults, show_env)


def build_parser(
    program: Program,
    prog: str,
    description: str,
    *,
    fill_defaults: bool,
    usage: str | None = None,
    epilog: str | None = None,
) -> FlagArgumentParser:
    """The program's parser; `usage` replaces argparse's generated one (every flag)."""
    parser = FlagArgumentParser(
        prog=prog,
        description=description,
        usage=usage,
        epilog=epilog,
        add_help=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "-h", "--help", "--usage", action="help", help="show every flag with its default and exit"
    )
    add_flags(
        parser,
        flags_for(program),
        fill_defaults=fill_defaults,
        show_env=program is Program.SERVER,
    )
    return parser


def _checked(row: Flag) -> Callable[[str], Any] | None:
    parse = row.env_parse or row.parse
    if not row.choices or parse is None:
        return parse

    def parse_choice(text: str) -> Any:
        value = parse(text)
        if value not in row.choices:
            raise argparse.ArgumentTypeError(
                f"invalid choice {text!r}: use one of {', '.join(row.choices)}"
            )
        return value

    return parse_choice


def bindings_of(rows: tuple[Flag, ...]) -> list[EnvBinding]:
    """The environment variables of `rows` (the ACTIVE ones that name one)."""
    return [
        EnvBinding(row.env, row.dest, _checked(row), negatable=bool(row.negative))
        for row in rows
        if row.env and row.status is Status.ACTIVE
    ]


def env_bindings(program: Program) -> list[EnvBinding]:
    return bindings_of(flags_for(program, Status.ACTIVE))


def resolve(
    program: Program, ns: argparse.Namespace, env_values: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, str]]:
    """CLI > environment > default for every ACTIVE, non-repeatable row; fills `ns` too.
    Sources are kept for the server group's rows, and for any row set from the environment."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for row in flags_for(program, Status.ACTIVE):
        if row.append:
            continue
        if hasattr(ns, row.dest):
            values[row.dest], source = getattr(ns, row.dest), "cli"
        elif row.dest in env_values:
            values[row.dest], source = env_values[row.dest], "env"
        else:
            values[row.dest], source = row.default, "default"
        if row.group in SOURCED_GROUPS or source == "env":  # the KVMEM_STARTUP record's sources
            sources[row.dest] = source
        setattr(ns, row.dest, values[row.dest])
    return values, sources
