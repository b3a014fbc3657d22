"""The comparison of two suite runs: per-file counts, totals and the tests only one passes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conformance.compare import Run, load_run, main, only_passed_by, report

REFERENCE = {
    "test_basic::test_a": "passed",
    "test_basic::test_b": "passed",
    "test_security::test_c": "failed",
    "test_security::test_d": "skipped",
}
CANDIDATE = {
    "test_basic::test_a": "passed",
    "test_basic::test_b": "error",
    "test_security::test_c": "passed",
    "test_security::test_d": "passed",
}


def test_report_counts_each_file_and_names_the_differences() -> None:
    lines = report(Run(REFERENCE), Run(CANDIDATE), ("llama-server", "kvmem-server"))
    assert lines == [
        "| file | llama-server passed / failed / skipped | kvmem-server passed / failed / skipped |",
        "|---|---:|---:|",
        "| test_basic | 2 / 0 / 0 | 1 / 1 / 0 |",
        "| test_security | 0 / 1 / 1 | 2 / 0 / 0 |",
        "| **all** | **2 / 1 / 1** | **3 / 1 / 0** |",
        "",
        "Passed by llama-server, not by kvmem-server (1):",
        "- test_basic::test_b (kvmem-server: error)",
        "",
        "Passed by kvmem-server, not by llama-server (2):",
        "- test_security::test_c (llama-server: failed)",
        "- test_security::test_d (llama-server: skipped)",
    ]


def test_a_test_the_other_run_lacks_counts_as_not_passed() -> None:
    assert only_passed_by(Run({"f::t": "passed"}), Run({})) == ["f::t"]


def _write(path: Path, outcomes: dict[str, str]) -> Path:
    path.write_text(
        json.dumps([{"test": t, "outcome": o, "message": ""} for t, o in outcomes.items()])
    )
    return path


def test_exit_status_is_1_when_the_candidate_passes_fewer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ref, cand = _write(tmp_path / "r.json", REFERENCE), _write(tmp_path / "c.json", CANDIDATE)
    assert load_run(ref).passed == 2 and load_run(cand).passed == 3
    for args, status in (([str(ref), str(cand)], 0), ([str(cand), str(ref)], 1)):
        monkeypatch.setattr("sys.argv", ["compare.py", *args])
        with pytest.raises(SystemExit) as exit_:
            main()
        assert exit_.value.code == status
    assert "| **all** | **3 / 1 / 0** | **2 / 1 / 1** |" in capsys.readouterr().out
