"""Server counters behind `/metrics` (opt-in, `--metrics`); rendered by prometheus_client
(kvmem.server.metrics_registry).

Request-level counters come from each turn's usage; KVMem transfer counters and gauges
come from the engine's cumulative stats, snapshotted by the worker thread after each job
(the HTTP side never touches the engine), except the disk tier's, which its stores count
under their own lock and a scrape reads as they are (`ServerMetrics.read_live`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from kvmem.chat.turn import TurnUsage
from kvmem.server.metrics_llamacpp import LlamaCppCounters, llamacpp_rows


@dataclass(slots=True)
class ServerCounters:
    requests_total: int = 0
    requests_failed: int = 0
    requests_rejected: int = 0  # 503: queue full
    prompt_tokens: int = 0
    cache_hit_tokens: int = 0
    cache_miss_tokens: int = 0
    generated_tokens: int = 0
    reasoning_tokens: int = 0
    prefill_ms: float = 0.0
    decode_ms: float = 0.0


# (metric name, help, engine stats field, scale, type)
_ENGINE_METRICS: tuple[tuple[str, str, str, float, str], ...] = (
    (
        "kvmem_stage_in_bytes_total",
        "KV bytes copied from the host store into the GPU window",
        "stage_in_bytes",
        1.0,
        "counter",
    ),
    (
        "kvmem_harvested_bytes_total",
        "KV bytes copied from the GPU to the host store",
        "harvested_bytes",
        1.0,
        "counter",
    ),
    (
        "kvmem_stage_in_blocks_total",
        "blocks copied into the GPU window",
        "stage_in_blocks",
        1.0,
        "counter",
    ),
    (
        "kvmem_harvested_blocks_total",
        "blocks copied to the host store",
        "harvested_blocks",
        1.0,
        "counter",
    ),
    (
        "kvmem_reselect_seconds_total",
        "time spent reselecting the window",
        "reselect_ms",
        1e-3,
        "counter",
    ),
    (
        "kvmem_replayed_tokens_total",
        "query tokens processed again after reselection",
        "replayed_tokens",
        1.0,
        "counter",
    ),
    (
        "kvmem_spilled_blocks_total",
        "generation blocks moved to the host when the reserve filled",
        "spilled_blocks",
        1.0,
        "counter",
    ),
    (
        "kvmem_draft_tokens_total",
        "speculative draft tokens verified",
        "draft_n",
        1.0,
        "counter",
    ),
    (
        "kvmem_draft_accepted_tokens_total",
        "speculative draft tokens accepted",
        "draft_n_accepted",
        1.0,
        "counter",
    ),
    (
        "kvmem_host_store_bytes",
        "bytes held by the host block store",
        "host_store_bytes",
        1.0,
        "gauge",
    ),
    ("kvmem_host_blocks", "blocks held by the host block store", "host_blocks", 1.0, "gauge"),
    ("kvmem_gpu_cells_used", "KV cells used in the GPU context", "gpu_cells_used", 1.0, "gauge"),
    (
        "kvmem_tier_ram_hits_total",
        "block reads served by the RAM tier",
        "tier_ram_hits",
        1.0,
        "counter",
    ),
    (
        "kvmem_tier_ram_misses_total",
        "block reads that went to the disk tier",
        "tier_ram_misses",
        1.0,
        "counter",
    ),
    ("kvmem_tier_ram_bytes", "bytes of blocks held in RAM", "tier_ram_bytes", 1.0, "gauge"),
    ("kvmem_tier_ram_blocks", "blocks held in RAM", "tier_ram_blocks", 1.0, "gauge"),
    ("kvmem_tier_disk_bytes", "bytes of block files on disk", "tier_disk_bytes", 1.0, "gauge"),
    ("kvmem_tier_disk_blocks", "durable block files on disk", "tier_disk_blocks", 1.0, "gauge"),
    (
        "kvmem_tier_disk_read_bytes_total",
        "bytes read from the disk tier",
        "tier_disk_read_bytes",
        1.0,
        "counter",
    ),
    (
        "kvmem_tier_disk_write_bytes_total",
        "bytes written to the disk tier",
        "tier_disk_write_bytes",
        1.0,
        "counter",
    ),
    (
        "kvmem_tier_write_failures_total",
        "failed block file writes",
        "tier_write_failures",
        1.0,
        "counter",
    ),
    (
        "kvmem_tier_degraded",
        "1 when the disk tier stopped writing (RAM-only)",
        "tier_degraded",
        1.0,
        "gauge",
    ),
    ("kvmem_conversations", "conversations kept warm", "conversations", 1.0, "gauge"),
    (
        "kvmem_conversation_switches_total",
        "GPU window swaps between conversations",
        "conversation_switches",
        1.0,
        "counter",
    ),
    (
        "kvmem_conversation_switch_seconds_total",
        "time spent swapping the GPU window between conversations",
        "conversation_switch_ms",
        1e-3,
        "counter",
    ),
    (
        "kvmem_conversations_evicted_total",
        "conversations evicted (least recently used)",
        "conversations_evicted",
        1.0,
        "counter",
    ),
    (
        "kvmem_gpu_cells_max",
        "KV cells of the GPU context (budget + reserve)",
        "gpu_cells_max",
        1.0,
        "gauge",
    ),
)


class ServerMetrics:
    """Thread-safe counters; `render` writes the Prometheus text format."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters = ServerCounters()
        self._engine: dict[str, Any] = {}
        self.processing = 0
        self.deferred = 0
        self.n_batch = 2048  # -b, for llamacpp:n_decode_total
        self._llamacpp = LlamaCppCounters()
        self._registry: Any = None  # a MetricsRegistry, built on the first scrape
        # the disk tier's figures, read at each scrape (its writer thread lands a turn's
        # blocks after the turn's end, when the engine stats were snapshotted)
        self._live: Callable[[], Mapping[str, int]] | None = None

    def record_turn(self, usage: TurnUsage) -> None:
        with self._lock:
            c = self._counters
            c.requests_total += 1
            c.prompt_tokens += usage.prompt_tokens
            c.cache_hit_tokens += usage.cached_tokens
            c.cache_miss_tokens += usage.prompt_tokens - usage.cached_tokens
            c.generated_tokens += usage.completion_tokens
            c.reasoning_tokens += usage.reasoning_tokens
            c.prefill_ms += usage.prefill_ms
            c.decode_ms += usage.decode_ms
            self._llamacpp.record(
                usage.prefill_tokens,
                usage.completion_tokens,
                usage.prompt_tokens + usage.completion_tokens,
                self.n_batch,
            )

    def record_failure(self) -> None:
        with self._lock:
            self._counters.requests_total += 1
            self._counters.requests_failed += 1

    def record_rejected(self) -> None:
        with self._lock:
            self._counters.requests_rejected += 1

    def set_engine_stats(self, stats: Any) -> None:
        snapshot = (
            {f.name: getattr(stats, f.name) for f in fields(stats)} if stats is not None else {}
        )
        with self._lock:
            self._engine = snapshot

    def read_live(self, source: Callable[[], Mapping[str, int]]) -> None:
        """Engine stats that `source` reads at scrape time, over the job-end snapshot
        (`ChatEngine.tier_gauges`: thread-safe reads of the disk tier's stores)."""
        self._live = source

    def counters(self) -> ServerCounters:
        with self._lock:
            return ServerCounters(
                **{f.name: getattr(self._counters, f.name) for f in fields(ServerCounters)}
            )

    def engine_value(self, name: str) -> Any:
        with self._lock:
            return self._engine.get(name, 0)

    def render(self) -> str:
        """The Prometheus text exposition, through this app's prometheus_client registry."""
        if self._registry is None:
            # imported on the first scrape: a server without --metrics needs no prometheus_client
            from kvmem.server.metrics_registry import MetricsRegistry

            self._registry = MetricsRegistry(self.rows)
        return self._registry.render()

    def rows(self) -> list[tuple[str, str, str, float]]:
        """(name, help, type, value) of every series, read now."""
        c = self.counters()
        rows: list[tuple[str, str, str, float]] = [
            (
                "kvmem_requests_total",
                "chat completions finished or failed",
                "counter",
                c.requests_total,
            ),
            (
                "kvmem_requests_failed_total",
                "chat completions that failed",
                "counter",
                c.requests_failed,
            ),
            (
                "kvmem_requests_rejected_total",
                "requests refused with 503 (queue full)",
                "counter",
                c.requests_rejected,
            ),
            (
                "kvmem_requests_processing",
                "requests generating now (busy lanes)",
                "gauge",
                self.processing,
            ),
            ("kvmem_requests_deferred", "requests waiting for the slot", "gauge", self.deferred),
            (
                "kvmem_prompt_tokens_total",
                "prompt tokens of all requests",
                "counter",
                c.prompt_tokens,
            ),
            (
                "kvmem_prompt_cache_hit_tokens_total",
                "prompt tokens reused from the session",
                "counter",
                c.cache_hit_tokens,
            ),
            (
                "kvmem_prompt_cache_miss_tokens_total",
                "prompt tokens processed",
                "counter",
                c.cache_miss_tokens,
            ),
            ("kvmem_generated_tokens_total", "tokens generated", "counter", c.generated_tokens),
            (
                "kvmem_reasoning_tokens_total",
                "generated tokens inside thinking blocks",
                "counter",
                c.reasoning_tokens,
            ),
            ("kvmem_prompt_seconds_total", "prompt processing time", "counter", c.prefill_ms / 1e3),
            ("kvmem_decode_seconds_total", "generation time", "counter", c.decode_ms / 1e3),
        ]
        with self._lock:
            rows += llamacpp_rows(c, self._llamacpp, self.processing, self.deferred)
        live = self._live() if self._live is not None else {}
        for name, help_text, stat, scale, kind in _ENGINE_METRICS:
            value = live[stat] if stat in live else self.engine_value(stat)
            rows.append((name, help_text, kind, float(value) * scale))
        return rows
