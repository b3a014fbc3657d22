"""decode-sweep: points, measurement and ratios with a fake engine whose speed depends on
the attended context."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kvmem.bench.decode_sweep import (
    SweepConfig,
    SweepPoint,
    SweepSettings,
    random_prompt,
    run_sweep,
    table,
)
from kvmem.bench.main import main
from kvmem.bench.synth_model import ModelShape, WeightType, write_synthetic_model
from kvmem.config import KVCacheTypes

SETTINGS = SweepSettings(
    model_path="m.gguf",
    contexts=(1024, 4096),
    configs=(SweepConfig.STOCK, SweepConfig.KVMEM),
    budget=512,
    gen_reserve=256,
    gen_tokens=16,
    cache_types=KVCacheTypes(),
    n_batch=512,
    n_ubatch=512,
    n_threads=None,
    n_gpu_layers=0,
)


class TimedEngine:
    """Decode costs 1 ms + 1 ms per 1000 attended tokens; prefill 1 ms per 100 tokens.
    A KVMem engine attends over at most `budget` + generated tokens."""

    def __init__(self, point: SweepPoint, budget: int) -> None:
        self.point = point
        self.budget = budget
        self.info = SimpleNamespace(n_vocab=1000)
        self.last_turn: Any = None
        self.stats = SimpleNamespace(
            host_store_bytes=123 if point.config is SweepConfig.KVMEM else 0, gpu_cells_peak=7
        )
        self.prompts: list[list[int]] = []
        self.closed = False

    def generate(
        self,
        prompt: Sequence[int],
        *,
        query: Any = None,
        sampling: Any = None,
        max_tokens: int = -1,
        ignore_eos: bool = False,
    ) -> Iterator[int]:
        """Like a real model, ends at its end-of-generation token (the 9th) unless that
        token is banned."""
        self.prompts.append(list(prompt))
        max_tokens = max_tokens if ignore_eos else min(max_tokens, 8)
        attended = len(prompt)
        if self.point.config is SweepConfig.KVMEM:
            attended = min(attended, self.budget)
        self.last_turn = SimpleNamespace(
            prefill_tokens=len(prompt),
            prefill_ms=len(prompt) / 100,
            generated_tokens=max_tokens,
            decode_ms=max_tokens * (1 + attended / 1000),
            stage_in_blocks=0,
        )
        yield from range(max_tokens)

    def reset(self) -> None:
        self.prompts.append([])

    def close(self) -> None:
        self.closed = True


def test_a_negative_stream_is_refused_before_any_model_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"")  # never read: the flags are checked first
    assert main(["decode-sweep", "-m", str(model), "--stream-tokens", "-2"]) == 2
    err = capsys.readouterr().err
    assert "--kvmem-stream-tokens: must be >= 0 (or -1 for the default), got -2" in err


def test_points_start_with_stock_at_the_window() -> None:
    assert SETTINGS.points() == [
        SweepPoint(SweepConfig.STOCK, 512, window=True),
        SweepPoint(SweepConfig.STOCK, 1024),
        SweepPoint(SweepConfig.STOCK, 4096),
        SweepPoint(SweepConfig.KVMEM, 1024),
        SweepPoint(SweepConfig.KVMEM, 4096),
    ]


def test_random_prompt_is_seeded_and_in_range() -> None:
    a = random_prompt(50, 1000, seed=3)
    assert a == random_prompt(50, 1000, seed=3) and a != random_prompt(50, 1000, seed=4)
    assert len(a) == 50 and all(100 <= t < 1000 for t in a)


def test_run_sweep_ratios_against_stock_at_the_window() -> None:
    engines: list[TimedEngine] = []

    def opener(point: SweepPoint) -> TimedEngine:
        engines.append(TimedEngine(point, SETTINGS.budget))
        return engines[-1]

    results = run_sweep(SETTINGS, opener)
    assert all(e.closed for e in engines)
    assert [[len(p) for p in e.prompts] for e in engines] == [
        [16, 0, n] for n in (496, 1008, 4080, 1008, 4080)
    ]
    window = results[0]
    assert window.window and window.context == 512
    assert window.decode_tok_s == pytest.approx(1000 / (1 + 496 / 1000))
    stock_4k = results[2]
    assert stock_4k.decode_ratio_vs_window == pytest.approx((1 + 496 / 1000) / (1 + 4080 / 1000))
    kv_4k = results[4]
    assert kv_4k.decode_ratio_vs_window == pytest.approx((1 + 496 / 1000) / (1 + 512 / 1000))
    assert kv_4k.prefill_tok_s == pytest.approx(100_000.0)
    assert kv_4k.prefill_ratio_vs_window == pytest.approx(1.0)
    assert kv_4k.host_store_bytes == 123 and kv_4k.generated_tokens == 16
    lines = table(results).splitlines()
    assert lines[1].split()[:3] == ["config", "context", "prompt"]
    assert lines[3].startswith("stock@window") and lines[7].startswith("kvmem")


@pytest.mark.llama
@pytest.mark.model
def test_command_on_a_tiny_synthetic_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "tiny.gguf"
    shape = ModelShape(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, n_ctx_train=4096)
    write_synthetic_model(model, shape, WeightType.Q8_0, seed=0, threads=2)
    rc = main(
        [
            "decode-sweep",
            "-m",
            str(model),
            "--contexts",
            "1024,2048",
            "--budget",
            "1024",
            "--gen-reserve",
            "128",
            "--block-tokens",
            "64",  # 13 window slots: sink 1, recent 2, the query 8, and 2 for the ranked blocks
            "--harvest-tokens",
            "256",  # two blocks wait, then go together
            "--stream-tokens",
            "512",  # half the budget: the default's value, spelled out
            "--gen-tokens",
            "16",
            "--configs",
            "stock,kvmem,kvmem-numpy,kvmem-nocb,kvmem-scoring,kvmem-scoring-after,offload",
            "-t",
            "2",
            "--out",
            str(tmp_path),
        ]
    )
    assert rc == 0
    assert "stock@window" in capsys.readouterr().out
    doc = json.loads((tmp_path / "decode_sweep.json").read_text())
    assert doc["settings"]["cache_type_k"] == "f16" and doc["settings"]["budget"] == 1024
    assert doc["settings"]["block_tokens"] == 64 and doc["settings"]["harvest_tokens"] == 256
    assert doc["settings"]["stream_tokens"] == 512
    rows = [(r["config"], r["context"], r["window"]) for r in doc["results"]]
    assert rows == [
        ("stock", 1024, True),
        ("stock", 1024, False),
        ("stock", 2048, False),
        ("kvmem", 1024, False),
        ("kvmem", 2048, False),
        ("kvmem-numpy", 1024, False),
        ("kvmem-numpy", 2048, False),
        ("kvmem-nocb", 1024, False),
        ("kvmem-nocb", 2048, False),
        ("kvmem-scoring", 1024, False),
        ("kvmem-scoring", 2048, False),
        ("kvmem-scoring-after", 1024, False),
        ("kvmem-scoring-after", 2048, False),
        ("offload", 1024, False),
        ("offload", 2048, False),
    ]
    for r in doc["results"]:
        assert r["generated_tokens"] == 16 and r["prompt_tokens"] == r["context"] - 16
        assert r["prefill_tok_s"] > 0 and r["decode_tok_s"] > 0 and r["decode_ratio_vs_window"] > 0
        assert r["turn_s"] > 0
    kvmem_2k, numpy_2k = doc["results"][4], doc["results"][6]
    assert kvmem_2k["host_store_bytes"] > 0  # the history beyond the budget went to the host
    # the native and the numpy copy path store the same history; the prefill loop is timed
    assert numpy_2k["host_store_bytes"] == kvmem_2k["host_store_bytes"]
    for r in (kvmem_2k, numpy_2k):
        assert r["transfer"]["prefill_decode"]["calls"] == r["transfer"]["prefill_gap"]["calls"]
        assert r["transfer"]["prefill_gap"]["calls"] >= 2
    assert kvmem_2k["gpu_cells_peak"] <= 1024 + 128
    # without an eval callback llama.cpp never calls into KVMem; the window still streams
    nocb_2k = doc["results"][8]
    assert kvmem_2k["transfer"]["capture"]["calls"] > 0
    assert "capture" not in nocb_2k["transfer"]
    assert nocb_2k["host_store_bytes"] == kvmem_2k["host_store_bytes"]
    # the scoring context reads the query: the callback runs, on the small context only
    scoring_2k = doc["results"][10]
    assert scoring_2k["transfer"]["scoring_decode"]["calls"] >= 1
    assert scoring_2k["transfer"]["capture"]["calls"] > 0
    assert scoring_2k["host_store_bytes"] == kvmem_2k["host_store_bytes"]
    # the query work after the prefill instead of beside it: the same history and query
    after_2k = doc["results"][12]
    assert (
        after_2k["transfer"]["scoring_decode"]["calls"]
        == scoring_2k["transfer"]["scoring_decode"]["calls"]
    )
    assert after_2k["host_store_bytes"] == scoring_2k["host_store_bytes"]


@pytest.mark.llama
@pytest.mark.model
@pytest.mark.slow
def test_every_point_decodes_its_tokens_on_a_real_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Qwen2.5-Coder-0.5B ends a random prompt's reply with an end-of-generation token at
    once; the sweep bans it, so each point decodes --gen-tokens tokens."""
    rc = main(
        [
            "decode-sweep",
            "-m",
            "qwen-0.5b",
            "--contexts",
            "256,512",
            "--budget",
            "256",
            "--gen-reserve",
            "128",
            "--block-tokens",
            "64",
            "--gen-tokens",
            "12",
            "--configs",
            "stock,kvmem",
            "-t",
            "2",
            "--out",
            str(tmp_path),
        ]
    )
    assert rc == 0
    doc = json.loads((tmp_path / "decode_sweep.json").read_text())
    got = [(r["config"], r["context"], r["generated_tokens"]) for r in doc["results"]]
    assert got == [
        ("stock", 256, 12),
        ("stock", 256, 12),
        ("stock", 512, 12),
        ("kvmem", 256, 12),
        ("kvmem", 512, 12),
    ]
    assert all(r["decode_tok_s"] > 0 for r in doc["results"])
