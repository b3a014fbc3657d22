"""`kvmem-bench lanes` on SmolLM2 (CPU): KVMem lanes, then the plain-llama.cpp baseline of
the two lane designs (N seq ids in one context vs N contexts), tables and lanes.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvmem.bench.main import main

pytestmark = pytest.mark.slow

GEN = 8


def test_lanes_bench_with_the_seq_id_baseline(
    smollm2_path: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["lanes", "-m", smollm2_path, "--lanes", "1,2", "--gen-tokens", str(GEN), "-ngl", "0"]
    argv += ["-c", "1024", "--budget", "512", "--gen-reserve", "128", "-t", "1"]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "concurrent lanes, 8 tokens each" in out
    assert "plain llama.cpp, no KVMem: 8 tokens per sequence" in out
    payload = json.loads((tmp_path / "lanes.json").read_text())
    assert [r["lanes"] for r in payload["results"]] == [1, 2]
    assert [r["tokens"] for r in payload["results"]] == [GEN, 2 * GEN]
    rows = payload["baseline_no_kvmem"]
    assert [(r["sequences"], r["tokens"]) for r in rows] == [(1, GEN - 1), (2, 2 * (GEN - 1))]
    for r in rows:
        assert r["one_context_tok_s"] > 0 and r["n_contexts_tok_s"] > 0
        ratio = r["one_context_tok_s"] / r["n_contexts_tok_s"]
        assert r["one_context_over_n_contexts"] == pytest.approx(ratio)
        # row s of a batched step is sequence s: the two designs decode the same greedy
        # tokens (a mix-up of rows would part them at once; rounding only late, if at all)
        assert r["same_greedy_tokens"] >= GEN // 2
