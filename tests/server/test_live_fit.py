"""`--fit on` on a real kvmem-server (SmolLM2, on the CPU with `--gpu-mem`): the window in
/props is the hand computation from the GGUF, and the plan is logged at startup."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
from gguf import GGUFReader

from kvmem.gguf.model_path import default_model_path
from tests.server.conftest import run_server, start_server

MIB = 1 << 20


def smollm2_kv_bytes_per_token(path: str) -> int:
    fields = GGUFReader(path, "r").fields
    n_layer = fields["llama.block_count"].contents()  # 30
    n_kv_heads = fields["llama.attention.head_count_kv"].contents()  # 3
    head_dim = (
        fields["llama.embedding_length"].contents()
        // fields["llama.attention.head_count"].contents()
    )  # 576 / 9 = 64
    return 2 * n_layer * n_kv_heads * head_dim * 2  # K and V, f16


def test_fit_on_sizes_the_window_and_props_show_the_plan(server_logs: Path) -> None:
    model = default_model_path()
    per_token = smollm2_kv_bytes_per_token(model)
    assert per_token == 23040
    args = ("-c", "8192", "--fit", "on", "--gpu-mem", "400MiB", "--fit-target", "256", "-t", "2")
    server = start_server(args, server_logs)
    try:
        body = httpx.get(server.base_url + "/props", timeout=60).json()["kvmem"]
        cells = (400 * MIB - os.path.getsize(model) - 256 * MIB) // per_token
        reserve = int(cells * 4096 / (32768 + 4096)) // 128 * 128
        budget = (cells - reserve) // 128 * 128
        assert (body["budget"], body["gen_reserve"]) == (budget, reserve) == (2048, 128)
        fit = body["fit"]
        assert fit["kv_bytes_per_token"] == per_token
        assert fit["weights_bytes"] == os.path.getsize(model)
        assert (fit["memory_source"], fit["memory_bytes"]) == ("--gpu-mem", 400 * MIB)
        assert (fit["budget"], fit["gen_reserve"], fit["lanes"]) == (budget, reserve, 1)
        log = server.log()
        assert f"--fit on: --kvmem-budget {budget} --kvmem-gen-reserve {reserve}" in log
        assert f"--fit plan: {cells} cells: gen reserve 11% -> {reserve}" in log
    finally:
        assert server.stop() == 0, server.log()[-3000:]


def test_fit_refuses_an_explicit_budget() -> None:
    done = run_server(["--fit", "on", "--gpu-mem", "1GiB", "--kvmem-budget", "2048"])
    assert done.returncode == 2, done.stderr
    assert "--fit: sizes --kvmem-budget itself: drop --kvmem-budget or use --fit off" in done.stderr
