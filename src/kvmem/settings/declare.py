"""One declaration per setting: a settings dataclass field that carries its flag.

    @dataclass(frozen=True, slots=True)
    class KVMemConfig:
        budget: int = setting(32768, "--kvmem-budget", help="GPU KV tokens ...",
                              parse=int32, metavar="N", group=Group.KVMEM)

`setting()` is `dataclasses.field()` with a `Flag` in the field's metadata: the flag's names,
value parser, environment variable, help, `--help` group and programs. `flags_of(cls)` reads
them back as the rows kvmem.cli.flag_parser turns into argparse parsers, `--help` groups and
`LLAMA_ARG_*`/`KVMEM_*` bindings, and kvmem.cli.flag_doc into docs/server.md's flag table;
`from_values(cls, ns)` builds the record from the parsed values. Enum fields need no parser:
their choices are the enum's values and the parsed text becomes the member.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Mapping
from enum import Enum
from functools import partial
from typing import Any

from .flag import Flag, Group, Program

FLAG = "kvmem.flag"  # the metadata key of a field's Flag
_SAME: Any = object()  # flag_default not given: the field's default


def setting(
    default: Any,
    *names: str,
    help: str,
    group: Group,
    parse: Callable[[str], Any] | None = None,
    env: str | None = None,
    programs: Program = Program.SERVER,
    metavar: str | None = None,
    shown: str | None = None,
    negative: tuple[str, ...] = (),
    choices: tuple[str, ...] = (),
    flag_default: Any = _SAME,
    to_field: Callable[[Any], Any] | None = None,
    env_parse: Callable[[str], Any] | None = None,
    append: bool = False,
    dest: str = "",
) -> Any:
    """A dataclass field with `default` whose flag is `names` (the first is the short or
    only name). `flag_default` is the parsed value when the flag is not given, where it
    differs from the field's default (None: "not given", resolved by the record's builder);
    `to_field` turns the parsed value into the field's; `dest` overrides the argparse
    destination (by default the field's name after the `flags_of` prefix)."""
    if isinstance(default, Enum) and parse is None:  # the enum's values, no parser needed
        choices = choices or tuple(m.value for m in type(default))
        parse, to_field = str, to_field or type(default)
        flag_default = default.value if flag_default is _SAME else flag_default
    row = Flag(
        names,
        dest,
        help,
        parse,
        default if flag_default is _SAME else flag_default,
        env,
        negative=negative,
        append=append,
        metavar=metavar,
        shown_default=shown,
        choices=choices,
        programs=programs,
        group=group,
        env_parse=env_parse,
        to_field=to_field,
    )
    return dataclasses.field(default=default, metadata={FLAG: row})


def _declared(cls: type) -> list[tuple[dataclasses.Field[Any], Flag]]:
    return [(f, f.metadata[FLAG]) for f in dataclasses.fields(cls) if FLAG in f.metadata]


def declared_fields(cls: type) -> tuple[tuple[str, Flag], ...]:
    """Each declared field's name with its flag row, in field order."""
    return tuple((field.name, row) for field, row in _declared(cls))


def flags_of(cls: type, prefix: str = "") -> tuple[Flag, ...]:
    """The flag rows of `cls`'s declared fields, in field order."""
    return tuple(
        dataclasses.replace(row, dest=row.dest or prefix + field.name)
        for field, row in _declared(cls)
    )


def from_values(
    cls: type[Any], values: argparse.Namespace | Mapping[str, Any], prefix: str = "", **given: Any
) -> Any:
    """`cls` built from parsed flag values (a namespace or a mapping keyed by destination);
    `given` sets fields the caller resolves itself."""
    read = values.__getitem__ if isinstance(values, Mapping) else partial(getattr, values)
    kwargs = dict(given)
    for field, row in _declared(cls):
        if field.name in given:
            continue
        value = read(row.dest or prefix + field.name)
        kwargs[field.name] = row.to_field(value) if row.to_field else value
    return cls(**kwargs)
