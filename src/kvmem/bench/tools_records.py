"""Per-round records of the tool benchmark and the rates over a whole run.

Rates over the task, as in the original: initial-computation prefill = new input tokens /
time of their first processing (prefill minus reselection, replay and harvest time);
overall prefill = new input tokens / all prefill time (reprocessing and cache management
included); decode = generated tokens / decode time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvmem.bench.http_client import StreamOutcome
from kvmem.bench.report import format_table


@dataclass(slots=True)
class RoundRecord:
    round: int
    prompt_tokens: int
    cached_tokens: int
    new_tokens: int
    completion_tokens: int
    context_tokens: int  # prompt + completion
    wall_s: float
    ttft_s: float | None
    prefill_s: float
    initial_prefill_s: float
    decode_s: float
    prefill_tok_s: float | None  # overall: new tokens / all prefill time
    initial_prefill_tok_s: float | None
    decode_tok_s: float | None
    timing_source: str  # "server" or "client"
    finish_reason: str | None
    rss_bytes: int | None
    gpu_used_bytes: int | None
    stage_in_blocks: float | None
    stage_in_bytes: float | None
    harvested_bytes: float | None
    reselect_s: float | None
    replayed_tokens: float | None
    host_store_bytes: float | None
    gpu_cells_used: float | None


@dataclass(slots=True)
class ToolsSummary:
    label: str
    rounds: int
    final_context_tokens: int
    new_tokens: int
    generated_tokens: int
    initial_prefill_tok_s: float | None
    overall_prefill_tok_s: float | None
    decode_tok_s: float | None
    last_decode_tok_s: float | None
    peak_rss_bytes: int | None
    peak_gpu_used_bytes: int | None
    stage_in_bytes: float | None
    harvested_bytes: float | None
    reselect_s: float | None
    reselect_share: float | None  # reselection time / all request time
    wall_s: float


_METRIC_DELTAS = {
    "stage_in_blocks": ("kvmem_stage_in_blocks_total", 1.0),
    "stage_in_bytes": ("kvmem_stage_in_bytes_total", 1.0),
    "harvested_bytes": ("kvmem_harvested_bytes_total", 1.0),
    "reselect_s": ("kvmem_reselect_seconds_total", 1.0),
    "replayed_tokens": ("kvmem_replayed_tokens_total", 1.0),
    "prompt_s": ("kvmem_prompt_seconds_total", 1.0),
    "decode_s": ("kvmem_decode_seconds_total", 1.0),
}


def ratio(num: float | None, den: float | None) -> float | None:
    """num / den, or None when either is missing or den is not positive."""
    return num / den if num is not None and den is not None and den > 0 else None


def make_record(
    index: int,
    out: StreamOutcome,
    before: dict[str, float] | None,
    after: dict[str, float] | None,
    rss: int | None,
    gpu: int | None,
) -> RoundRecord:
    usage = out.usage
    prompt = int(usage.get("prompt_tokens", 0))
    details = usage.get("prompt_tokens_details") or {}
    cached = int(details.get("cached_tokens", usage.get("prompt_cache_hit_tokens", 0)) or 0)
    completion = int(usage.get("completion_tokens", out.n_deltas))
    deltas: dict[str, float | None] = {k: None for k in _METRIC_DELTAS}
    if before is not None and after is not None:
        for key, (name, scale) in _METRIC_DELTAS.items():
            if name in after:
                deltas[key] = (after[name] - before.get(name, 0.0)) * scale
    kv = out.kvmem
    if kv:
        deltas["stage_in_blocks"] = kv.get("stage_in_blocks", deltas["stage_in_blocks"])
        deltas["stage_in_bytes"] = kv.get("stage_in_bytes", deltas["stage_in_bytes"])
        deltas["harvested_bytes"] = kv.get("harvested_bytes", deltas["harvested_bytes"])
        if "reselect_ms" in kv:
            deltas["reselect_s"] = kv["reselect_ms"] / 1e3
        deltas["replayed_tokens"] = kv.get("replayed_tokens", deltas["replayed_tokens"])
    t = out.timings
    if t.get("prompt_ms") is not None and t.get("predicted_ms") is not None:
        source, prefill_s, decode_s = "server", t["prompt_ms"] / 1e3, t["predicted_ms"] / 1e3
    elif deltas["prompt_s"] is not None and deltas["decode_s"] is not None:
        source, prefill_s, decode_s = "server", deltas["prompt_s"], deltas["decode_s"]
    else:
        ttft = out.ttft_s if out.ttft_s is not None else out.total_s
        source, prefill_s, decode_s = "client", ttft, max(0.0, out.total_s - ttft)
    overhead = (deltas["reselect_s"] or 0.0) + (
        kv.get("replay_ms", 0.0) + kv.get("harvest_ms", 0.0)
    ) / 1e3
    initial_s = max(prefill_s - overhead, 0.0)
    new = prompt - cached
    decode_tokens = completion if source == "server" else max(completion - 1, 0)
    return RoundRecord(
        round=index,
        prompt_tokens=prompt,
        cached_tokens=cached,
        new_tokens=new,
        completion_tokens=completion,
        context_tokens=prompt + completion,
        wall_s=out.total_s,
        ttft_s=out.ttft_s,
        prefill_s=prefill_s,
        initial_prefill_s=initial_s,
        decode_s=decode_s,
        prefill_tok_s=ratio(new, prefill_s),
        initial_prefill_tok_s=ratio(new, initial_s),
        decode_tok_s=ratio(decode_tokens, decode_s),
        timing_source=source,
        finish_reason=out.finish_reason,
        rss_bytes=rss,
        gpu_used_bytes=gpu,
        stage_in_blocks=deltas["stage_in_blocks"],
        stage_in_bytes=deltas["stage_in_bytes"],
        harvested_bytes=deltas["harvested_bytes"],
        reselect_s=deltas["reselect_s"],
        replayed_tokens=deltas["replayed_tokens"],
        host_store_bytes=None if after is None else after.get("kvmem_host_store_bytes"),
        gpu_cells_used=None if after is None else after.get("kvmem_gpu_cells_used"),
    )


def summarize_rounds(label: str, records: Sequence[RoundRecord]) -> ToolsSummary:
    new = sum(r.new_tokens for r in records)
    decode_tokens = sum(
        r.completion_tokens if r.timing_source == "server" else max(r.completion_tokens - 1, 0)
        for r in records
    )

    def total(name: str) -> float | None:
        values = [getattr(r, name) for r in records if getattr(r, name) is not None]
        return sum(values) if values else None

    def peak(name: str) -> int | None:
        values = [getattr(r, name) for r in records if getattr(r, name) is not None]
        return max(values) if values else None

    wall = sum(r.wall_s for r in records)
    reselect = total("reselect_s")
    return ToolsSummary(
        label=label,
        rounds=len(records) - 1,
        final_context_tokens=records[-1].context_tokens if records else 0,
        new_tokens=new,
        generated_tokens=sum(r.completion_tokens for r in records),
        initial_prefill_tok_s=ratio(new, sum(r.initial_prefill_s for r in records)),
        overall_prefill_tok_s=ratio(new, sum(r.prefill_s for r in records)),
        decode_tok_s=ratio(decode_tokens, sum(r.decode_s for r in records)),
        last_decode_tok_s=records[-1].decode_tok_s if records else None,
        peak_rss_bytes=peak("rss_bytes"),
        peak_gpu_used_bytes=peak("gpu_used_bytes"),
        stage_in_bytes=total("stage_in_bytes"),
        harvested_bytes=total("harvested_bytes"),
        reselect_s=reselect,
        reselect_share=None if reselect is None else ratio(reselect, wall),
        wall_s=wall,
    )


def round_table(records: Sequence[RoundRecord]) -> str:
    rows = [
        [
            r.round,
            r.prompt_tokens,
            r.cached_tokens,
            r.new_tokens,
            r.completion_tokens,
            r.initial_prefill_tok_s,
            r.prefill_tok_s,
            r.decode_tok_s,
            r.stage_in_blocks,
            r.reselect_s,
            None if r.rss_bytes is None else r.rss_bytes / 2**20,
        ]
        for r in records
    ]
    return format_table(
        [
            "round",
            "prompt",
            "cached",
            "new",
            "gen",
            "init pf tok/s",
            "pf tok/s",
            "dec tok/s",
            "stage-in",
            "reselect s",
            "RSS MiB",
        ],
        rows,
        "tool benchmark rounds",
    )


def summary_table(summaries: Sequence[ToolsSummary]) -> str:
    rows = [
        [
            s.label,
            s.rounds,
            s.final_context_tokens,
            s.initial_prefill_tok_s,
            s.overall_prefill_tok_s,
            s.decode_tok_s,
            s.last_decode_tok_s,
            None if s.peak_rss_bytes is None else s.peak_rss_bytes / 2**30,
            None if s.peak_gpu_used_bytes is None else s.peak_gpu_used_bytes / 2**30,
            s.reselect_s,
            s.reselect_share,
        ]
        for s in summaries
    ]
    return format_table(
        [
            "config",
            "rounds",
            "final ctx",
            "init pf tok/s",
            "overall pf tok/s",
            "decode tok/s",
            "last decode",
            "peak RSS GiB",
            "peak GPU GiB",
            "reselect s",
            "reselect share",
        ],
        rows,
        "tool benchmark summary",
    )
