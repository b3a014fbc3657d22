"""Where a turn's query vectors come from (`--kvmem-query-source`, or nowhere)."""

from __future__ import annotations

from enum import Enum


class SourceKind(Enum):
    NONE = "none"  # KVMem off, or no capture: the plan ranks nothing by a query
    MAIN = "main"  # the main context's eval callback, during the prefill
    SCORING = "scoring"  # a scoring context of its own, from the prompt's tokens
