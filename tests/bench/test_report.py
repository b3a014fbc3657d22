"""Tables and JSON conversion."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import numpy as np

from kvmem.bench.report import format_table, fraction, to_jsonable, write_json


class Color(Enum):
    RED = "red"


@dataclass(slots=True)
class Row:
    name: str
    color: Color
    value: float
    path: Path


def test_format_table_aligns_and_formats_numbers() -> None:
    text = format_table(["name", "x", "y"], [["a", 1.5, None], ["long name", 12345.678, 2e-5]], "T")
    assert text == (
        "T\n"
        "name             x          y\n"
        "---------  -------  ---------\n"
        "a           1.5000          -\n"
        "long name  12345.7  2.000e-05"
    )


def test_to_jsonable_and_write_json(tmp_path: Path) -> None:
    row = Row("r", Color.RED, math.nan, Path("/x"))
    data = {"rows": [row], "n": np.int64(3), "f": np.float32(0.5), (1, 2): (3,)}
    assert to_jsonable(data) == {
        "rows": [{"name": "r", "color": "red", "value": None, "path": "/x"}],
        "n": 3,
        "f": 0.5,
        "[1, 2]": [3],
    }
    assert write_json(None, "x.json", {}) is None
    path = write_json(tmp_path / "sub", "x.json", {"a": row})
    assert json.loads(path.read_text()) == {
        "a": {"name": "r", "color": "red", "value": None, "path": "/x"}
    }
    assert fraction(1, 4) == 0.25 and fraction(1, 0) is None
