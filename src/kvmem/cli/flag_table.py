"""Every flag of kvmem-server and kvmem-cli, in `--help` order within each group.

Each flag is one `Flag` row (kvmem.settings.flag). The settings records declare theirs on
their fields (`kvmem.settings.setting`; `flags_of` reads them back): `KVMemConfig`,
`KVCacheFlags`, `SpecConfig`, `ServerSettings`, `ServerLimits`, `SamplingParams`, the flag
records of kvmem.cli.server_flags and kvmem-cli's (kvmem.cli.cli_flags). Only llama-server's compatibility rows
(accepted with no effect, rejected) are a table (kvmem.cli.flag_table_compat). From these
rows kvmem.cli.flag_parser builds both argparse parsers, `--help` and the `LLAMA_ARG_*`
environment bindings, and kvmem.cli.flag_doc the flag table in docs/server.md
(`python -m kvmem.cli.flag_doc --write`; a unit test checks that the doc is current).
"""

from __future__ import annotations

from kvmem.cli.cli_flags import CliFlags
from kvmem.cli.fit_flags import FitFlags
from kvmem.cli.flag_table_compat import NOOP_TABLE, REJECTED_TABLE
from kvmem.cli.kv_cache_flags import KVCacheFlags
from kvmem.cli.limit_flags import ServerLimits
from kvmem.cli.server_flags import AuthFlags, LogFlags, ModelFlags, TemplateFlags, VisionFlags
from kvmem.cli.server_settings import ServerSettings
from kvmem.config import KVMemConfig
from kvmem.sampling import SamplingParams
from kvmem.settings import Flag, Program, Status, flags_of
from kvmem.spec_config import SpecConfig

KVMEM_PREFIX = "kvmem_"  # the argparse destinations of KVMemConfig's flags
KV_CACHE_FLAGS: tuple[Flag, ...] = flags_of(KVCacheFlags)
KVMEM_FLAGS: tuple[Flag, ...] = flags_of(KVMemConfig, KVMEM_PREFIX)
SPEC_FLAGS: tuple[Flag, ...] = flags_of(SpecConfig, "spec_")
CLI_FLAGS: tuple[Flag, ...] = flags_of(CliFlags)
SERVER_FLAGS: tuple[Flag, ...] = tuple(
    row
    for record in (
        ModelFlags,
        ServerSettings,
        FitFlags,
        SamplingParams,
        TemplateFlags,
        VisionFlags,
        LogFlags,
        ServerLimits,
        AuthFlags,
    )
    for row in flags_of(record)
)

FLAGS: tuple[Flag, ...] = (
    SERVER_FLAGS
    + CLI_FLAGS
    + KV_CACHE_FLAGS
    + KVMEM_FLAGS
    + SPEC_FLAGS
    + NOOP_TABLE
    + REJECTED_TABLE
)


def flags_for(program: Program, status: Status | None = None) -> tuple[Flag, ...]:
    """The rows `program` parses, optionally only those of one status, in table order."""
    return tuple(f for f in FLAGS if f.used_by(program) and (status is None or f.status is status))


def _check_unique() -> None:
    for program in (Program.SERVER, Program.CLI):
        seen: dict[str, str] = {}
        for row in flags_for(program):
            for name in row.flags + row.negative:
                if name in seen:
                    raise AssertionError(f"{name} is in the flag table twice ({program})")
                seen[name] = row.dest


_check_unique()
