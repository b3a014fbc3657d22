"""The record of one command-line flag (kvmem.settings.declare puts one on a settings field).

One `Flag` describes one command-line flag for the programs that use it: its names, its
value parser (None: a switch), default, choices, environment variable, help text, the
`--help` group, and its status: ACTIVE (has a meaning), NOOP (accepted, documented as
meaningless under KVMem) or REJECTED (parsed only to fail with `reason`). ACTIVE rows come
from settings fields (`setting(...)`); NOOP and REJECTED rows are llama-server's
compatibility table (kvmem.cli.flag_table_compat).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class Program(enum.Flag):
    SERVER = enum.auto()
    CLI = enum.auto()
    BOTH = SERVER | CLI


class Status(enum.Enum):
    ACTIVE = "active"
    NOOP = "no-op"
    REJECTED = "rejected"


class Group(enum.Enum):
    """`--help` sections, in the order they are shown: what a person looks for first
    (the model, the memory, sampling, the network) before the details."""

    MODEL = "model & context"
    KVMEM = "KVMem memory"
    KV_CACHE = "KV cache types"
    SAMPLING = "sampling"
    CLI = "generation (kvmem-cli)"
    SERVER = "server & network"
    AUTH = "authentication"
    UI = "chat page"
    TEMPLATE = "chat template & thinking"
    VISION = "vision"
    GPU = "GPU placement"
    LOG = "logging"
    SPEC = "speculative decoding"
    NOOP = "llama-server compatibility: accepted, no effect"
    REJECTED = "llama-server compatibility: rejected"


# the groups whose values' sources go into the KVMEM_STARTUP record (kvmem-server's own)
SOURCED_GROUPS = frozenset(
    {
        Group.MODEL,
        Group.SAMPLING,
        Group.SERVER,
        Group.AUTH,
        Group.UI,
        Group.TEMPLATE,
        Group.VISION,
        Group.GPU,
        Group.LOG,
    }
)


@dataclass(frozen=True, slots=True)
class Flag:
    flags: tuple[str, ...]
    dest: str
    help: str
    parse: Callable[[str], Any] | None = None  # value parser; None: a switch
    default: Any = None
    env: str | None = None  # LLAMA_ARG_* / KVMEM_* variable (read by kvmem-server)
    negative: tuple[str, ...] = ()  # --no-x forms of a switch
    append: bool = False
    metavar: str | None = None
    shown_default: str | None = None  # how --help shows the default
    choices: tuple[str, ...] = ()
    programs: Program = Program.SERVER
    group: Group = Group.SERVER
    status: Status = Status.ACTIVE
    reason: str = ""  # NOOP/REJECTED: why (shown in --help and in the error)
    takes_value: bool = False  # NOOP/REJECTED: the flag consumes one value
    optional_value: bool = False  # NOOP: the value may be left out (`--log-colors [on]`)
    env_parse: Callable[[str], Any] | None = None  # the variable's parser when not `parse`
    to_field: Callable[[Any], Any] | None = None  # the parsed value -> the settings field's

    @property
    def is_switch(self) -> bool:
        return self.parse is None and not self.choices

    def used_by(self, program: Program) -> bool:
        return bool(self.programs & program)

    def shown(self) -> str:
        """The default as `--help` and docs/server.md show it."""
        if self.shown_default is not None:
            return self.shown_default
        value = self.default
        if isinstance(value, bool):
            return "enabled" if value else "disabled"
        if hasattr(value, "value"):
            return str(value.value)
        if value is None or value == ():
            return "none"
        return str(value)


def noop(
    flags: tuple[str, ...],
    reason: str,
    parse: Callable[[str], Any] | None = None,
    *,
    metavar: str | None = None,
    optional_value: bool = False,
) -> Flag:
    """An accepted flag without an effect; with `parse` it takes a value, checked by it
    (so a launch line with a wrong value still fails, as it would on llama-server)."""
    return Flag(
        flags,
        "compat_noop",
        reason,
        parse,
        group=Group.NOOP,
        status=Status.NOOP,
        reason=reason,
        takes_value=parse is not None,
        optional_value=optional_value,
        metavar=metavar,
    )


def rejected(flags: tuple[str, ...], reason: str, takes_value: bool = False) -> Flag:
    return Flag(
        flags,
        "compat_rejected",
        f"rejected: {reason}",
        group=Group.REJECTED,
        status=Status.REJECTED,
        reason=reason,
        takes_value=takes_value,
    )
