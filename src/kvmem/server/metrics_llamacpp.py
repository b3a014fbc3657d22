"""llama-server's `llamacpp:*` series on `/metrics`, with its names, help and types.

Computed from KVMem's own counters: prompt tokens processed (not reused) and their time,
tokens generated and their time, decode calls (a prompt counts one call per `-b` batch,
each generated token after the first one call), the largest context seen. The gauges
are rates over the server's lifetime (llama-server uses the span since the last scrape)
and the state of the one KVMem lane. No speculative decoding: those counters stay 0.
"""

from __future__ import annotations

from dataclasses import dataclass

Row = tuple[str, str, str, float]


@dataclass(slots=True)
class LlamaCppCounters:
    n_decode: int = 0
    n_tokens_max: int = 0
    busy_last_decode: int = 0

    def record(self, prefill_tokens: int, completion_tokens: int, total: int, n_batch: int) -> None:
        batches = -(-prefill_tokens // max(1, n_batch)) if prefill_tokens > 0 else 0
        self.n_decode += batches + max(0, completion_tokens - 1)
        self.n_tokens_max = max(self.n_tokens_max, total)
        if batches or completion_tokens > 1:
            self.busy_last_decode = 1


def llamacpp_rows(c: object, extra: LlamaCppCounters, processing: int, deferred: int) -> list[Row]:
    prompt_n = c.cache_miss_tokens
    cached = c.cache_hit_tokens
    predicted = c.generated_tokens
    prompt_s = c.prefill_ms / 1e3
    predicted_s = c.decode_ms / 1e3
    p = "llamacpp:"
    return [
        (
            p + "prompt_tokens_total",
            "Number of prompt tokens processed, excluding cached tokens",
            "counter",
            prompt_n,
        ),
        (
            p + "prompt_tokens_cached_total",
            "Number of prompt tokens reused from the cache",
            "counter",
            cached,
        ),
        (p + "prompt_seconds_total", "Total time spent processing prompts", "counter", prompt_s),
        (
            p + "tokens_predicted_total",
            "Number of generation tokens processed",
            "counter",
            predicted,
        ),
        (
            p + "tokens_predicted_seconds_total",
            "Total time spent generating tokens",
            "counter",
            predicted_s,
        ),
        (
            p + "n_decode_total",
            "Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding",
            "counter",
            extra.n_decode,
        ),
        (
            p + "n_tokens_max",
            "Largest observed sequence length (prompt + generation)",
            "counter",
            extra.n_tokens_max,
        ),
        (
            p + "spec_decode_num_draft_tokens_total",
            "Speculative: Total draft tokens generated",
            "counter",
            0,
        ),
        (
            p + "spec_decode_num_accepted_tokens_total",
            "Speculative: Total draft tokens accepted by the target model",
            "counter",
            0,
        ),
        (
            p + "spec_decode_num_drafts_total",
            "Speculative: Total speculative decoding verification steps",
            "counter",
            0,
        ),
        (
            p + "prompt_tokens_seconds",
            "Average prompt throughput in tokens/s",
            "gauge",
            prompt_n / prompt_s if prompt_s > 0 else 0.0,
        ),
        (
            p + "predicted_tokens_seconds",
            "Average generation throughput in tokens/s",
            "gauge",
            predicted / predicted_s if predicted_s > 0 else 0.0,
        ),
        (p + "requests_processing", "Number of requests processing", "gauge", processing),
        (p + "requests_deferred", "Number of requests deferred", "gauge", deferred),
        (
            p + "n_busy_slots_per_decode",
            "Average number of busy slots per llama_decode() call",
            "gauge",
            extra.busy_last_decode,
        ),
    ]
