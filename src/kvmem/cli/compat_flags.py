"""llama-server flags that a stock launch line passes and KVMem handles specially: the
NOOP and REJECTED rows of the flag table (kvmem.cli.flag_table_compat), as views.

`--slots`/`--no-slots`, `--reasoning-format` and `-v/--verbose` have meanings and are
ACTIVE flags, declared on their settings records (kvmem.cli.flag_table lists them).
"""

from __future__ import annotations

from kvmem.cli.flag_table import flags_for
from kvmem.settings.flag import Flag, Program, Status

CompatFlag = Flag  # the record's former name
NOOP_SWITCHES: tuple[Flag, ...] = flags_for(Program.SERVER, Status.NOOP)
REJECTED_FLAGS: tuple[Flag, ...] = flags_for(Program.SERVER, Status.REJECTED)

__all__ = ["NOOP_SWITCHES", "REJECTED_FLAGS", "CompatFlag"]
