"""The evaluation commands end to end on SmolLM2-135M-Instruct, on small grids.

They check the JSON each command writes (documented fields, sane ranges) and that full
context recalls the short needles; KVMem quality is reported by the commands, not
asserted here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvmem.bench.main import main

COMMON = ["-c", "2048", "--kvmem-budget", "512", "--kvmem-gen-reserve", "256", "-t", "2"]


def test_needle_small_grid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        [
            "needle",
            *COMMON,
            "--lengths",
            "1100",
            "--depths",
            "2",
            "--seeds",
            "1",
            "--methods",
            "full,retrieval,recency",
            "--out",
            str(tmp_path),
        ]
    )
    assert rc == 0
    assert "needle passkey, document layout, ~1100 tokens" in capsys.readouterr().out
    doc = json.loads((tmp_path / "needle.json").read_text())
    assert doc["grid"]["depths"] == [0.0, 1.0] and doc["grid"]["lengths"] == [1100]
    assert len(doc["cases"]) == 6
    for case in doc["cases"]:
        assert 1050 <= case["prompt_tokens"] <= 1200
        assert case["correct"] == (case["expected"] in case["answer"])
        assert case["prefill_ms"] >= 0 and case["decode_ms"] >= 0
    assert doc["summary"]["full"]["accuracy"] >= 0.8
    for method in ("retrieval", "recency"):
        assert 0.0 <= doc["summary"][method]["accuracy"] <= 1.0
    assert sorted(p.name for p in tmp_path.glob("*.png")) == [
        "needle_full.png",
        "needle_recency.png",
        "needle_retrieval.png",
    ]


def test_fidelity_small_transcript(tmp_path: Path) -> None:
    rc = main(
        ["fidelity", *COMMON, "--target-tokens", "1500", "--tool-size", "8", "--out", str(tmp_path)]
    )
    assert rc == 0
    doc = json.loads((tmp_path / "fidelity.json").read_text())
    assert doc["transcript"]["final_prompt_tokens"] > 512
    for summary in doc["overall"]:
        if summary["scored_tokens"]:
            assert summary["mean_kl"] >= 0 and summary["p99_kl"] >= 0
            assert 0.0 <= summary["top1_agreement"] <= 1.0
    for turn in doc["turns"]:
        assert turn["mean_kl"] >= 0 and 0.0 <= turn["top1_agreement"] <= 1.0
        if not turn["over_budget"]:
            # everything fits: KVMem is invisible, the logits are those of full context
            assert turn["mean_kl"] == 0.0 and turn["top1_agreement"] == 1.0
        if turn["coverage"] is not None:
            assert 0.0 <= turn["coverage"] <= 1.0 + 1e-9
    over = [t for t in doc["turns"] if t["over_budget"]]
    assert over and all(t["coverage"] is not None for t in over)


def test_agent_small_episode(tmp_path: Path) -> None:
    rc = main(
        [
            "agent",
            *COMMON,
            "--episodes",
            "1",
            "--target-tokens",
            "1200",
            "--methods",
            "full,retrieval,lastn",
            "--out",
            str(tmp_path),
        ]
    )
    assert rc == 0
    doc = json.loads((tmp_path / "agent.json").read_text())
    assert set(doc["accuracy"]) == {"full", "retrieval", "lastn"}
    for row in doc["accuracy"].values():
        assert row["total"] == 7 and 0.0 <= row["all"] <= 1.0
    full = [r for r in doc["results"] if r["method"] == "full"]
    assert [r["cached_tokens"] > 1000 for r in full] == [False] + [True] * 6
