"""scripts/gpu-protocol.sh without a GPU: its steps, resumption and bad step names."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu-protocol.sh"
STEPS = [
    f"needle-{layout}-{length}"
    for length in (28672, 16384, 8192)
    for layout in ("tools", "agent", "document")
] + ["oracle-tools-28672", "oracle-agent-28672", "agent-user", "agent-tool", "fidelity-28672"]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


def test_list_shows_every_step_and_which_are_done(tmp_path: Path) -> None:
    (tmp_path / "needle-agent-16384").mkdir()
    (tmp_path / "needle-agent-16384" / "needle.json").write_text(json.dumps({"complete": True}))
    (tmp_path / "needle-tools-8192").mkdir()  # a stopped run: its checkpoint is incomplete
    (tmp_path / "needle-tools-8192" / "needle.json").write_text(json.dumps({"complete": False}))
    (tmp_path / "agent-tool").mkdir()
    (tmp_path / "agent-tool" / "agent.json").write_text("{")  # cut off mid-write
    (tmp_path / "fidelity-28672").mkdir()
    (tmp_path / "fidelity-28672" / "fidelity.json").write_text(json.dumps({"command": "x"}))
    result = run(str(tmp_path), "list")
    assert result.returncode == 0, result.stderr
    done = {"needle-agent-16384", "fidelity-28672"}
    assert result.stdout.splitlines() == [
        f"{'done' if step in done else 'todo'}  {step}" for step in STEPS
    ]


def test_the_tools_step_is_listed_only_when_asked_for(tmp_path: Path) -> None:
    result = run(str(tmp_path), "list", env=dict(os.environ, PROTOCOL_TOOLS="1"))
    assert result.stdout.splitlines()[-1] == "todo  tools"


def test_an_unknown_step_is_refused_before_anything_runs(tmp_path: Path) -> None:
    result = run(str(tmp_path / "out"), "needle-agent-8192", "needles-agent-8192")
    assert result.returncode == 2
    assert result.stderr == "unknown step needles-agent-8192\n"
    assert not (tmp_path / "out").exists()
