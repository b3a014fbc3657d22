"""Plain-text tables and JSON files for benchmark results."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import platform
from collections.abc import Sequence
from enum import Enum
from pathlib import Path
from typing import Any

from kvmem.cli.kvmem_flags import strict_int
from kvmem.settings.values import gpu_layers

logger = logging.getLogger(__name__)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]], title: str = "") -> str:
    """A left-aligned first column and right-aligned other columns, space separated."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, text in enumerate(row):
            widths[i] = max(widths[i], len(text))

    def line(values: Sequence[str]) -> str:
        parts = [values[0].ljust(widths[0])] + [
            v.rjust(w) for v, w in zip(values[1:], widths[1:], strict=True)
        ]
        return "  ".join(parts).rstrip()

    out = [title] if title else []
    out.append(line(list(headers)))
    out.append("  ".join("-" * w for w in widths))
    out += [line(row) for row in cells]
    return "\n".join(out)


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e6):
            return f"{value:.3e}"
        return f"{value:.4f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def to_jsonable(value: Any) -> Any:
    """Dataclasses, enums, paths and numpy scalars to plain JSON values (NaN -> None)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, dict):
        return {str(to_jsonable(k)): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy scalar
        return to_jsonable(value.item())
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    return value


def machine_description() -> dict[str, object]:
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
    }


def write_json(out_dir: str | Path | None, name: str, payload: dict[str, Any]) -> Path | None:
    """Write `payload` to OUT_DIR/NAME (creating the directory); None when no directory."""
    if out_dir is None:
        return None
    directory = Path(out_dir)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(json.dumps(to_jsonable(payload), indent=1, sort_keys=False) + "\n")
    logger.info("wrote %s", path)
    return path


def fraction(numerator: int, denominator: int) -> float | None:
    return numerator / denominator if denominator else None


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """-b, -t, -ngl and --out, as the single-model commands (lookup-drafts, mtp-overhead)
    take them."""
    p.add_argument("-b", "--batch-size", type=strict_int, default=512)
    p.add_argument("-t", "--threads", type=strict_int, default=None)
    p.add_argument(
        "-ngl", "--gpu-layers", type=gpu_layers, default=-1, help="N, all or auto (default: all)"
    )
    p.add_argument("--out", default=None, metavar="DIR")
