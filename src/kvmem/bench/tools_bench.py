"""`kvmem-bench tools`: the 256K tool benchmark against a running kvmem-server.

Sends the base request and the tool-result rounds of `tools_data` (streamed, greedy) and
records per round: prompt and cached tokens, prefill and decode times and rates, the
server's RSS, GPU memory (NVML), and KVMem stage-in/out and reselection from the
server's /metrics (start it with --metrics) or the response's `timings`/`kvmem` fields.
Prefill and decode times come from the server when it reports them, else from the
client (time to first token, and the rest). The rates are defined in `tools_records`.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kvmem.bench.http_client import (
    GpuMemoryProbe,
    fetch_metrics,
    get_json,
    listening_pid,
    process_rss_bytes,
    stream_chat,
    wait_healthy,
)
from kvmem.bench.report import machine_description, write_json
from kvmem.bench.tools_data import (
    DEFAULT_CHARS_PER_TOKEN,
    ToolFormat,
    ToolsPlan,
    build_conversations,
    request_body,
)
from kvmem.bench.tools_records import (
    RoundRecord,
    make_record,
    round_table,
    summarize_rounds,
    summary_table,
)
from kvmem.bench.transfer_report import bandwidths, transfer_table
from kvmem.cli.kvmem_flags import strict_float, strict_int
from kvmem.cli.progress_bar import stderr_bar
from kvmem.errors import BenchServerError, ConfigError

logger = logging.getLogger(__name__)


def run_tools(
    plan: ToolsPlan,
    base_url: str,
    model: str,
    api_key: str | None,
    pid: int | None,
    gpu: GpuMemoryProbe,
    ignore_eos: bool,
    on_round: Callable[[RoundRecord], None] | None = None,
) -> list[RoundRecord]:
    records = []
    for index, messages in enumerate(build_conversations(plan)):
        before = fetch_metrics(base_url, api_key)
        out = stream_chat(base_url, request_body(plan, messages, model, True, ignore_eos), api_key)
        after = fetch_metrics(base_url, api_key)
        rss = process_rss_bytes(pid) if pid is not None else None
        record = make_record(index, out, before, after, rss, gpu.used_bytes())
        records.append(record)
        if on_round is not None:
            on_round(record)
    return records


def server_transfer_profile(base_url: str, api_key: str | None) -> dict[str, Any]:
    """The server's data-movement profile from /props (`kvmem.transfer`), {} without one."""
    try:
        props = get_json(base_url, "/props", api_key)
    except BenchServerError:
        return {}
    return dict((props.get("kvmem") or {}).get("transfer") or {})


def plot_rounds(records: Sequence[RoundRecord], label: str, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [r.prompt_tokens / 1000 for r in records]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    ax1.plot(x, [r.decode_tok_s or 0 for r in records], marker="o")
    ax1.set_xlabel("context (K tokens)")
    ax1.set_ylabel("decode tok/s")
    ax1.set_title("decode")
    ax2.plot(
        x, [r.initial_prefill_tok_s or 0 for r in records], marker="o", label="initial computation"
    )
    ax2.plot(x, [r.prefill_tok_s or 0 for r in records], marker="s", label="overall")
    ax2.set_xlabel("context (K tokens)")
    ax2.set_ylabel("prefill tok/s")
    ax2.set_title("prefill")
    ax2.legend()
    fig.suptitle(f"tool benchmark: {label}")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "tools", help="the 256K tool benchmark against a running kvmem-server"
    )
    p.add_argument("--url", default="http://127.0.0.1:8080", help="server base URL")
    p.add_argument("--model", default="kvmem", help="model name sent in requests")
    p.add_argument("--api-key", default=None)
    p.add_argument("--label", default="kvmem", help="configuration name (file names, summaries)")
    p.add_argument("--rounds", type=strict_int, default=32)
    p.add_argument("--target-tokens", type=strict_int, default=262144)
    p.add_argument("--gen-tokens", type=strict_int, default=256, help="max_tokens of each request")
    p.add_argument("--chars-per-token", type=strict_float, default=DEFAULT_CHARS_PER_TOKEN)
    p.add_argument(
        "--tool-format", choices=[f.value for f in ToolFormat], default=ToolFormat.OPENAI.value
    )
    p.add_argument(
        "--ignore-eos", action="store_true", help="send ignore_eos (llama-server extension)"
    )
    p.add_argument("--seed", type=strict_int, default=0)
    p.add_argument(
        "--server-pid",
        type=strict_int,
        default=None,
        help="pid for RSS (default: the local process listening on the URL's port)",
    )
    p.add_argument("--gpu-index", type=strict_int, default=0)
    p.add_argument(
        "--wait", type=strict_float, default=0.0, help="wait up to S seconds for /health"
    )
    p.add_argument("--out", default=None, metavar="DIR")
    p.set_defaults(handler=run)


def run(ns: argparse.Namespace) -> int:
    if ns.rounds < 0 or ns.target_tokens <= 0 or ns.gen_tokens <= 0 or ns.chars_per_token <= 0:
        raise ConfigError("--rounds/--target-tokens/--gen-tokens", "must be positive")
    plan = ToolsPlan(
        rounds=ns.rounds,
        target_tokens=ns.target_tokens,
        gen_tokens=ns.gen_tokens,
        chars_per_token=ns.chars_per_token,
        seed=ns.seed,
        tool_format=ToolFormat(ns.tool_format),
    )
    base = ns.url.rstrip("/")
    if ns.wait > 0:
        wait_healthy(base, ns.wait, ns.api_key)
    pid = ns.server_pid
    if pid is None and base.rsplit(":", 1)[-1].isdigit():
        pid = listening_pid(int(base.rsplit(":", 1)[-1]))
    out_dir = Path(ns.out) if ns.out else None
    jsonl = None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        jsonl = (out_dir / f"tools_{ns.label}.jsonl").open("w")
    t0 = time.perf_counter()
    bar = stderr_bar(ns.progress_bar, total=ns.rounds + 1, desc="tools", unit="round")

    def on_round(record: RoundRecord) -> None:
        bar.update()
        logger.info("round %d: %s", record.round, record)
        if jsonl is not None:
            jsonl.write(json.dumps(asdict(record)) + "\n")
            jsonl.flush()

    try:
        records = run_tools(
            plan,
            base,
            ns.model,
            ns.api_key,
            pid,
            GpuMemoryProbe(ns.gpu_index),
            ns.ignore_eos,
            on_round,
        )
    finally:
        if jsonl is not None:
            jsonl.close()
    summary = summarize_rounds(ns.label, records)
    transfer = server_transfer_profile(base, ns.api_key)
    print(round_table(records))
    print()
    print(summary_table([summary]))
    if transfer:
        print()
        print(transfer_table([(ns.label, transfer)]))
    if out_dir is not None:
        try:
            plot: Path | None = plot_rounds(records, ns.label, out_dir / f"tools_{ns.label}.png")
        except ImportError as exc:  # matplotlib missing or broken: keep the numbers
            logger.warning("no plot: %s", exc)
            plot = None
        payload: dict[str, Any] = {
            "command": "tools",
            "label": ns.label,
            "plan": plan,
            "url": base,
            "machine": machine_description(),
            "summary": summary,
            "transfer": transfer,
            "bandwidths": bandwidths(transfer) if transfer else {},
            "plot": str(plot) if plot is not None else None,
            "seconds": time.perf_counter() - t0,
        }
        path = write_json(out_dir, f"tools_{ns.label}.json", payload)
        print(f"\nwrote {path}, {plot or 'no plot'} and tools_{ns.label}.jsonl")
    return 0
