"""/metrics through prometheus_client: llama-server's llamacpp:* series, names and types."""

from __future__ import annotations

from pathlib import Path

import prometheus_client
from prometheus_client.parser import text_string_to_metric_families

from kvmem.chat.turn import TurnUsage
from kvmem.engine.trace import EngineStats, tier_gauges
from kvmem.memory.tiered_store import TieredStore
from kvmem.server.metrics import ServerMetrics
from tests.unit.test_memory_tiered_store import _block as block

# llama-server's to_metrics() (tools/server/server-task.cpp, llama-cpp-python 0.3.36)
LLAMACPP_COUNTERS = (
    "prompt_tokens_total", "prompt_tokens_cached_total", "prompt_seconds_total",
    "tokens_predicted_total", "tokens_predicted_seconds_total", "n_decode_total",
    "n_tokens_max", "spec_decode_num_draft_tokens_total",
    "spec_decode_num_accepted_tokens_total", "spec_decode_num_drafts_total",
)  # fmt: skip
LLAMACPP_GAUGES = (
    "prompt_tokens_seconds", "predicted_tokens_seconds", "requests_processing",
    "requests_deferred", "n_busy_slots_per_decode",
)  # fmt: skip


def types_and_values(text: str) -> dict[str, tuple[str, float]]:
    """As llama.cpp's test_metrics.parse_metrics reads it: # TYPE lines, then samples."""
    types: dict[str, str] = {}
    out: dict[str, tuple[str, float]] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            types[name] = kind
        elif line and not line.startswith("#"):
            name, value = line.split(" ", 1)
            assert name in types, f"{name} has no # TYPE line"
            out[name] = (types[name], float(value))
    return out


def usage(prompt: int, cached: int, completion: int) -> TurnUsage:
    return TurnUsage(
        prompt_tokens=prompt,
        cached_tokens=cached,
        completion_tokens=completion,
        prefill_ms=50.0,
        decode_ms=100.0,
    )


def test_every_llamacpp_series_with_llama_servers_name_and_type() -> None:
    m = ServerMetrics()
    m.record_turn(usage(40, 8, 11))
    got = types_and_values(m.render())
    for name in LLAMACPP_COUNTERS:
        assert got["llamacpp:" + name][0] == "counter", name
    for name in LLAMACPP_GAUGES:
        assert got["llamacpp:" + name][0] == "gauge", name
    assert got["llamacpp:prompt_tokens_total"] == ("counter", 32.0)
    assert got["llamacpp:prompt_tokens_cached_total"] == ("counter", 8.0)
    assert got["llamacpp:tokens_predicted_total"] == ("counter", 11.0)
    assert got["llamacpp:n_tokens_max"] == ("counter", 51.0)
    assert got["llamacpp:n_decode_total"] == ("counter", 1.0 + 10.0)  # one prompt batch + 10
    assert got["llamacpp:prompt_tokens_seconds"] == ("gauge", 32 / 0.05)
    assert got["kvmem_requests_total"] == ("counter", 1.0)
    assert got["kvmem_generated_tokens_total"] == ("counter", 11.0)
    assert not [n for n in got if n.endswith("_created")]


def test_prometheus_clients_parser_reads_it() -> None:
    m = ServerMetrics()
    m.record_turn(usage(10, 0, 3))
    families = {f.name: f for f in text_string_to_metric_families(m.render())}
    assert families["llamacpp:tokens_predicted"].type == "counter"
    assert families["llamacpp:tokens_predicted"].samples[0].value == 3.0
    assert families["llamacpp:requests_processing"].type == "gauge"


def test_each_app_has_its_own_registry() -> None:
    a, b = ServerMetrics(), ServerMetrics()
    a.record_turn(usage(10, 0, 3))
    assert types_and_values(a.render())["llamacpp:tokens_predicted_total"][1] == 3.0
    assert types_and_values(b.render())["llamacpp:tokens_predicted_total"][1] == 0.0
    assert a._registry is not None and a._registry.registry is not prometheus_client.REGISTRY
    global_names = {f.name for f in prometheus_client.REGISTRY.collect()}
    assert not [n for n in global_names if n.startswith(("llamacpp:", "kvmem_"))]


def test_tier_gauges_read_the_blocks_the_writer_lands_after_a_snapshot(tmp_path: Path) -> None:
    """The server's /metrics reads `tier_gauges` at scrape time: a block the writer thread
    lands after the turn's stats were taken counts there, not only at the next turn."""
    s = TieredStore(tmp_path, ram_cap_bytes=416)
    try:
        metrics = ServerMetrics()
        snapshot = EngineStats(host_blocks=7)
        snapshot.set_tiers([s])  # the turn's end: nothing written yet
        metrics.set_engine_stats(snapshot)
        metrics.read_live(lambda: tier_gauges([s]))
        s.put(block(0))
        s.put(block(1))
        assert s.flush(10)
        rows = {name: value for name, _, _, value in metrics.rows()}
        assert rows["kvmem_tier_disk_blocks"] == 2.0
        assert rows["kvmem_tier_disk_bytes"] == 2.0 * 472
        assert rows["kvmem_tier_ram_blocks"] == 1.0  # the cap holds one block
        assert rows["kvmem_tier_degraded"] == 0.0
        assert rows["kvmem_host_blocks"] == 7.0  # the rest comes from the snapshot
        assert snapshot.tier_disk_blocks == 0
    finally:
        s.close()
