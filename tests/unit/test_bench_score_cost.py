"""`kvmem-bench score-cost` times the scorer at a shape, per threads and bound."""

from __future__ import annotations

import json

from kvmem.bench.main import main


def test_score_cost_reports_each_pair_with_the_sampled_query(tmp_path, capsys):
    rc = main(
        ["score-cost", "--blocks", "2000", "--n-layer", "4", "--n-head", "8", "--n-head-kv", "2",
         "--head-dim", "16", "--query-tokens", "64", "--threads", "1,2", "--mlogits", "0,1",
         "--top-k", "10", "--out", str(tmp_path)]
    )  # fmt: skip
    assert rc == 0
    results = json.loads((tmp_path / "score_cost.json").read_text())["results"]
    # 3 scored layers x 8 heads x 2000 blocks = 48,000 logits per query token: a bound of
    # 1M keeps 20 tokens (10 of each 32-token span)
    assert [(r["mlogits"], r["threads"], r["query_tokens"]) for r in results] == [
        (0, 1, 64), (0, 2, 64), (1, 1, 20), (1, 2, 20),
    ]  # fmt: skip
    assert results[0]["top_k_kept"] == 1.0 and results[1]["top_k_kept"] == 1.0
    assert "score cost: 2000 blocks x 3 layers x 8 heads" in capsys.readouterr().out
