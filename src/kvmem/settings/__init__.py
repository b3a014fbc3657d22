"""Settings declarations: flag records, value parsers and `setting()` fields.

The bottom of the layering next to kvmem.errors (standard library only), so that the
records that carry flags (kvmem.config, kvmem.spec_config, the CLI's) need neither
llama_cpp nor the engine.
"""

from .declare import declared_fields, flags_of, from_values, setting
from .flag import Flag, Group, Program, Status

__all__ = [
    "Flag",
    "Group",
    "Program",
    "Status",
    "declared_fields",
    "flags_of",
    "from_values",
    "setting",
]
