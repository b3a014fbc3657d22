"""`kvmem-bench tools` against a real kvmem-server on a tiny synthetic model: the tool loop
report (issue 34) is the arithmetic of the server's transfer profile, round by round."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvmem.bench.main import main
from kvmem.bench.synth_model import ModelShape, WeightType, write_synthetic_model
from kvmem.bench.transfer_report import HARVEST
from tests.server.conftest import start_server

SERVER_ARGS = (
    *("-c", "4096", "--kvmem-budget", "1024", "--kvmem-gen-reserve", "128"),
    *("--kvmem-harvest-tokens", "256"),
    *("--kvmem-query-source", "scoring", "--kvmem-query-ahead", "on"),
    *("--kv-dtype", "q8_0", "-fa", "on", "--metrics", "-t", "2"),
)


@pytest.mark.llama
@pytest.mark.model
def test_tool_loop_report_on_a_tiny_synthetic_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "tiny.gguf"
    # a K head of 64: llama.cpp shifts a q8_0 K cache only then (gguf/k_shift_meta.py)
    shape = ModelShape(n_layer=2, n_embd=256, n_head=4, n_head_kv=2, n_ff=128, n_ctx_train=4096)
    write_synthetic_model(model, shape, WeightType.Q8_0, seed=0, threads=2)
    server = start_server(["-m", str(model), *SERVER_ARGS], tmp_path)
    try:
        rc = main(
            [
                *("tools", "--url", server.base_url, "--label", "tiny", "--ignore-eos"),
                *("--rounds", "3", "--target-tokens", "3600", "--gen-tokens", "4"),
                *("--server-pid", str(server.proc.pid), "--out", str(tmp_path)),
            ]
        )
    finally:
        assert server.stop() == 0
    assert rc == 0
    assert "tool loop: what the turns waited for" in capsys.readouterr().out
    doc = json.loads((tmp_path / "tools_tiny.json").read_text())
    loop, summary, rounds = doc["loop"], doc["summary"], doc["transfer_rounds"]
    # the round deltas add up to the profile at the end (the engine was never reset)
    final = doc["transfer"]
    assert set(rounds) == set(final)
    for name, path in final.items():
        assert (rounds[name]["calls"], rounds[name]["bytes"]) == (path["calls"], path["bytes"])
        assert rounds[name]["ms"] == pytest.approx(path["ms"], rel=1e-9, abs=1e-9)

    def ms(name: str) -> float:
        return rounds.get(name, {}).get("ms", 0.0)

    restore = ms("state_build") + ms("ahead_wait") + ms("state_set")
    assert loop["restore_ms"] == restore and loop["state_set_ms"] == ms("state_set")
    assert loop["build_ahead_ms"] == ms("state_build_ahead")
    assert loop["built_ahead_blocks"] == rounds.get("state_build_ahead", {}).get("calls", 0)
    assert loop["build_wait_ms"] == ms("state_build") + ms("ahead_wait")
    assert loop["build_wait_share"] == loop["build_wait_ms"] / restore
    assert loop["harvest_reads"] == final["state_get"]["calls"] > 0  # over budget: harvests
    assert loop["harvested_bytes"] == final["state_get"]["bytes"]
    assert loop["harvest_read_ms"] == ms("state_get")
    assert loop["harvest_ms"] == sum(ms(n) for n in HARVEST)
    assert final["state_set"]["calls"] > 0  # reselections staged blocks in
    assert loop["reselect_s"] == summary["reselect_s"] > 0
    assert loop["reselect_share"] == summary["reselect_s"] / summary["wall_s"]
    assert loop["prefill_ratio"] == (
        summary["overall_prefill_tok_s"] / summary["initial_prefill_tok_s"]
    )
    # the host buffers held: the staging buffer and the built-ahead buffer, 64 MiB steps
    staging = doc["staging"]
    assert loop["staging_bytes"] == staging["bytes"]
    assert staging["bytes"] == staging["staging_bytes"] + staging["ahead_bytes"]
    assert staging["staging_bytes"] == 64 << 20
