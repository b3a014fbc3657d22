"""`kvmem-bench protocol --preset smoke` on SmolLM2: every step runs, the report follows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvmem.bench.main import main

pytestmark = [pytest.mark.llama, pytest.mark.model]

STEPS = ["needle-agent-passkey-1024", "needle-raw-passkey-1024", "agent-user", "fidelity-1536"]
METHODS = ["full", "retrieval", "recency", "compact-rag"]


def test_the_smoke_protocol_runs_every_step_and_resumes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["protocol", "--preset", "smoke", "--out", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    assert "needle recall (correct/total)" in table
    assert "agent memory" in table and "fidelity (teacher-forced" in table
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [s["name"] for s in summary["steps"]] == STEPS
    assert [s["status"] for s in summary["steps"]] == ["ran"] * 4
    assert summary["missing"] == []
    cells = {(r["layout"], r["kinds"]): r for r in summary["needle"]}
    assert sorted(cells) == [("agent", "passkey"), ("raw", "passkey")]
    for row in cells.values():
        assert [row[m]["total"] for m in METHODS] == [2, 2, 2, 2]
    assert sorted({r["method"] for r in summary["agent"]}) == sorted(METHODS)
    assert {r["method"] for r in summary["fidelity"]} == {"retrieval", "recency"}
    assert "compact-rag" in summary["excluded"]["fidelity/compact-rag"]
    assert (tmp_path / "summary.png").read_bytes()[:4] == b"\x89PNG"

    assert main(["protocol", "--preset", "smoke", "--out", str(tmp_path)]) == 0
    again = json.loads((tmp_path / "summary.json").read_text())
    assert [s["status"] for s in again["steps"]] == ["done"] * 4
    assert again["needle"] == summary["needle"]
