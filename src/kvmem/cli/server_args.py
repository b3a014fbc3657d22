"""kvmem-server's command line: llama-server's flags, `LLAMA_ARG_*` variables, validation.

The flags are the SERVER rows of the one flag table (kvmem.cli.flag_table); this module
builds the parser from it and resolves CLI > environment > default. Environment values
are parsed and validated first, so an invalid one fails even when a flag overrides it.
Everything here runs before the model loads; errors are `ConfigError`s naming the flag or
variable.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvmem import __version__
from kvmem.cli import flag_parser
from kvmem.cli.env_args import MISSING, EnvBinding, check_env_names, read_env_value, supported_names
from kvmem.cli.flag_parser import FlagArgumentParser, resolve
from kvmem.cli.flag_table import flags_for
from kvmem.settings.flag import Flag, Program, Status

logger = logging.getLogger(__name__)

FlagSpec = Flag  # the record's former name
SERVER_FLAGS: tuple[Flag, ...] = flags_for(Program.SERVER, Status.ACTIVE)
ServerArgumentParser = FlagArgumentParser
USAGE = "%(prog)s [-m FNAME|NAME] [-c N] [--kvmem-budget N] [--host HOST] [--port PORT] [FLAGS...]"


def env_bindings() -> list[EnvBinding]:
    return flag_parser.env_bindings(Program.SERVER)


def build_server_parser() -> FlagArgumentParser:
    p = flag_parser.build_parser(
        Program.SERVER,
        "kvmem-server",
        "OpenAI-compatible chat server with KVMem tiered KV memory, on llama.cpp.\n"
        "Takes llama-server's flags: each is listed below with its meaning, or as accepted\n"
        "with no effect, or rejected (with why).",
        fill_defaults=False,
        usage=USAGE,
        epilog="Examples:\n"
        "  kvmem-server                                   # the embedded model on 127.0.0.1:8080\n"
        "  kvmem-server -m model.gguf -c 65536 --kvmem-budget 8192 --port 8081\n"
        "  kvmem-server -m qwen-0.5b --api-key-file keys.txt --host 0.0.0.0",
    )
    p.add_argument("--version", action="version", version=f"kvmem-server {__version__}")
    return p


@dataclass(slots=True)
class ParsedArgs:
    """Flag values after CLI > env > default, with where each came from."""

    values: dict[str, Any]
    sources: dict[str, str]
    namespace: argparse.Namespace  # includes the shared kvmem/KV-cache flags
    warnings: list[str] = field(default_factory=list)
    env_api_keys: list[tuple[str, str]] = field(default_factory=list)  # (value, source)
    env_api_key_files: list[tuple[str, str]] = field(default_factory=list)
    given: frozenset[str] = frozenset()  # dests set on the command line or in the environment


def parse_server_argv(argv: Sequence[str], environ: Mapping[str, str]) -> ParsedArgs:
    """Parse the environment (validated first) and the command line."""
    bindings = env_bindings()
    warnings = check_env_names(environ, supported_names(bindings))
    env_values = {b.dest: v for b in bindings if (v := read_env_value(b, environ)) is not MISSING}
    ns = build_server_parser().parse_args(list(argv))
    given = frozenset(vars(ns)) | frozenset(env_values)  # before resolve fills in defaults
    values, sources = resolve(Program.SERVER, ns, env_values)
    parsed = ParsedArgs(values, sources, ns, warnings, given=given)
    if "api_key" in env_values:
        parsed.env_api_keys.append((env_values["api_key"], "LLAMA_API_KEY"))
    if "api_key_file" in env_values:
        parsed.env_api_key_files.append((env_values["api_key_file"], "LLAMA_ARG_API_KEY_FILE"))
    values["api_key"] = [(v, "--api-key") for v in getattr(ns, "api_key", [])]
    values["api_key_file"] = [(v, "--api-key-file") for v in getattr(ns, "api_key_file", [])]
    return parsed
