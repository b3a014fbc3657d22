"""`kvmem-bench score-cost` times session 4's scorer and today's, per threads and bound."""

from __future__ import annotations

import json

import pytest

from kvmem.bench.main import main


@pytest.mark.parametrize(("pinned", "sampled"), [(0, 20), (1200, 52)])
def test_score_cost_reports_each_pair_with_the_sampled_query(
    pinned: int, sampled: int, tmp_path, capsys
) -> None:
    rc = main(
        ["score-cost", "--blocks", "2000", "--pinned", str(pinned), "--n-layer", "4",
         "--n-head", "8", "--n-head-kv", "2", "--head-dim", "16", "--query-tokens", "64",
         "--threads", "1,2", "--mlogits", "0,1", "--top-k", "10", "--out", str(tmp_path)]
    )  # fmt: skip
    assert rc == 0
    results = json.loads((tmp_path / "score_cost.json").read_text())["results"]
    # 3 scored layers x 8 heads x 2000 (800) candidates = 48,000 (19,200) logits per query
    # token: a bound of 1M keeps 20 (52) tokens, half of them from each 32-token span
    assert [(r["mlogits"], r["threads"], r["query_tokens"]) for r in results] == [
        (0, 1, 64), (0, 2, 64), (1, 1, sampled), (1, 2, sampled),
    ]  # fmt: skip
    assert results[0]["top_k_kept"] == 1.0 and results[1]["top_k_kept"] == 1.0
    for r in results:  # the old and the new path score alike
        assert r["max_rel_diff"] < 1e-5 and r["top_k_old_new"] == 1.0
        assert r["old_seconds"] > 0 and r["new_seconds"] > 0
    out = capsys.readouterr().out
    assert f"score cost: {2000 - pinned} of 2000 blocks x 3 layers x 8 heads" in out


def test_score_cost_times_block_summaries(tmp_path, capsys) -> None:
    rc = main(
        ["score-cost", "--blocks", "64", "--pinned", "0", "--n-layer", "4", "--n-head", "8",
         "--n-head-kv", "2", "--head-dim", "32", "--query-tokens", "16", "--threads", "1",
         "--mlogits", "0", "--summary-blocks", "3", "--out", str(tmp_path)]
    )  # fmt: skip
    assert rc == 0
    doc = json.loads((tmp_path / "score_cost.json").read_text())
    assert doc["summary_ms_per_block"] > 0
    assert "block summaries:" in capsys.readouterr().out
