"""`kvmem-bench protocol` without a model: the preset table, resumption and the report."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from kvmem.bench import protocol
from kvmem.bench.protocol import StepRun, is_complete, run_step, selected
from kvmem.bench.protocol_presets import PRESETS, Step, preset
from kvmem.bench.protocol_report import report
from kvmem.errors import ConfigError

CPU_STEPS = [
    f"needle-{layout}-{kind}-14336"
    for layout in ("document", "tools", "agent", "raw")
    for kind in ("passkey", "multikey")
] + [
    "agent-user",
    "agent-tool",
    "fidelity-14336",
]


def test_the_presets_are_8x_with_20_cases_a_cell() -> None:
    """A cell is (layout, length) with both kinds, as BRIEF §5's table counts them."""
    assert sorted(PRESETS) == ["cpu", "gpu", "smoke"]
    cpu, gpu = PRESETS["cpu"], PRESETS["gpu"]
    assert (cpu.model, cpu.n_ctx, cpu.budget, cpu.gen_reserve) == ("qwen-0.5b", 16384, 2048, 256)
    assert (gpu.model, gpu.n_ctx, gpu.budget, gpu.gen_reserve) == ("qwen-0.5b", 32768, 4096, 512)
    assert [p.compression for p in PRESETS.values()] == [8.0, 8.0, 8.0]
    assert (cpu.cases_per_cell, gpu.cases_per_cell) == (20, 20)
    assert cpu.kinds == gpu.kinds == ("passkey", "multikey")
    assert cpu.layouts == gpu.layouts == ("document", "tools", "agent", "raw")
    assert PRESETS["smoke"].model is None  # SmolLM2


def test_cpu_steps_and_their_command_lines() -> None:
    steps = PRESETS["cpu"].steps(threads=3)
    assert [s.name for s in steps] == CPU_STEPS
    raw = steps[7]
    assert raw.json == "needle.json"
    assert raw.args[:13] == (
        "needle",
        "-m",
        "qwen-0.5b",
        "-t",
        "3",
        "-c",
        "16384",
        "--kvmem-budget",
        "2048",
        "--kvmem-gen-reserve",
        "256",
        "--kv-dtype",
        "f16",
    )
    assert raw.args[13:] == (
        "--seeds",
        "2",
        "--depths",
        "5",
        "--no-plots",
        "--kinds",
        "multikey",
        "--layouts",
        "raw",
        "--lengths",
        "14336",
        "--methods",
        "full,retrieval,recency,compact-rag",
    )
    tool = steps[9].args
    assert tool[tool.index("--final") + 1] == "tool"
    assert tool[-2:] == ("--methods", "full,retrieval,recency,compact-rag")
    assert steps[10].args[-2:] == ("--methods", "retrieval,recency")
    gpu_names = [s.name for s in PRESETS["gpu"].steps()]
    assert gpu_names[:2] == ["needle-document-passkey-28672", "needle-document-multikey-28672"]
    assert len(gpu_names) == 3 * 4 * 2 + 3


def test_an_unknown_preset_is_refused() -> None:
    with pytest.raises(ConfigError, match="unknown preset 'big'; use cpu, gpu, smoke"):
        preset("big")


def test_steps_picks_named_steps_in_the_presets_order() -> None:
    steps = PRESETS["cpu"].steps()
    picked = selected(steps, "fidelity-14336, needle-raw-passkey-14336")
    assert [s.name for s in picked] == ["needle-raw-passkey-14336", "fidelity-14336"]
    assert selected(steps, None) == steps
    with pytest.raises(ConfigError, match="unknown step\\(s\\) needle-raw-9; see --list"):
        selected(steps, "needle-raw-9,agent-user")


def writer_command(marker: Path, complete: bool, rc: int = 0) -> Callable[[Step, Path], list[str]]:
    """A real process standing in for a kvmem-bench step: writes its JSON and a marker."""

    def command(step: Step, out: Path) -> list[str]:
        path = out / step.name / step.json
        code = (
            f"import json, pathlib; pathlib.Path({str(marker)!r}).write_text('ran'); "
            f"pathlib.Path({str(path)!r}).write_text(json.dumps({{'complete': {complete}}})); "
            f"raise SystemExit({rc})"
        )
        return [sys.executable, "-c", code]

    return command


STEP = Step("needle-document-100", ("needle",), "needle.json")


def test_a_complete_step_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / STEP.name).mkdir()
    (tmp_path / STEP.name / "needle.json").write_text(json.dumps({"complete": True}))
    marker = tmp_path / "marker"
    monkeypatch.setattr(protocol, "command", writer_command(marker, True))
    result = run_step(STEP, tmp_path, threads=1)
    assert (result.status, result.seconds, marker.exists()) == ("done", 0.0, False)


@pytest.mark.parametrize("partial", ['{"complete": false}', "{", None])
def test_a_partial_or_missing_step_is_run_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, partial: str | None
) -> None:
    if partial is not None:
        (tmp_path / STEP.name).mkdir()
        (tmp_path / STEP.name / "needle.json").write_text(partial)
    marker = tmp_path / "marker"
    monkeypatch.setattr(protocol, "command", writer_command(marker, True))
    result = run_step(STEP, tmp_path, threads=1)
    assert (result.status, result.returncode, marker.read_text()) == ("ran", 0, "ran")
    assert is_complete(tmp_path / STEP.name / "needle.json")


def test_a_step_that_fails_or_stays_partial_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(protocol, "command", writer_command(tmp_path / "m", True, rc=3))
    assert run_step(STEP, tmp_path, threads=1).returncode == 3
    (tmp_path / STEP.name / STEP.json).unlink()
    monkeypatch.setattr(protocol, "command", writer_command(tmp_path / "m", False))
    result = run_step(STEP, tmp_path, threads=1)
    assert (result.status, result.returncode) == ("failed", 1)


def needle_case(method: str, kind: str, correct: bool) -> dict[str, object]:
    return {"method": method, "kind": kind, "layout": "raw", "length": 2048, "correct": correct}


def test_the_report_reads_the_steps_back(tmp_path: Path) -> None:
    smoke = PRESETS["smoke"]
    names = [s.name for s in smoke.steps()]
    assert names == [
        "needle-agent-passkey-1024",
        "needle-raw-passkey-1024",
        "agent-user",
        "fidelity-1536",
    ]
    cases = [needle_case("full", "passkey", True), needle_case("full", "passkey", True)]
    cases += [needle_case("retrieval", "passkey", True), needle_case("retrieval", "passkey", False)]
    cases += [needle_case("compact-rag", "passkey", False)] * 2
    (tmp_path / "needle-raw-passkey-1024").mkdir()
    doc = {"complete": True, "cases": cases}
    (tmp_path / "needle-raw-passkey-1024" / "needle.json").write_text(json.dumps(doc))
    runs = [StepRun(name, "ran", 1.0) for name in names]
    text = report(smoke, tmp_path, runs, 4.0)
    row = "raw 2048      2/2        1/2        -          0/2                        1"
    assert row in text.splitlines()
    missing = (
        "steps without a complete result: needle-agent-passkey-1024, agent-user, fidelity-1536"
    )
    assert missing in text
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["needle"] == [
        {
            "layout": "raw",
            "kinds": "passkey",
            "length": 2048,
            "full": {"correct": 2, "total": 2},
            "retrieval": {"correct": 1, "total": 2},
            "compact-rag": {"correct": 0, "total": 2},
            "retrieval_minus_compact_rag": 1,
        }
    ]
    assert summary["preset"]["compression"] == 8.0
    assert (tmp_path / "summary.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
