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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

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
from kvmem.bench.tools_loop import (
    STAGING,
    LoopReport,
    add_round,
    loop_report,
    loop_table,
    round_delta,
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
from kvmem.errors import BenchServerError, ConfigError, KVMemError

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class ToolsTarget:
    """One server of the run (a configuration) and what its rounds gave."""

    label: str
    url: str
    pid: int | None
    records: list[RoundRecord] = field(default_factory=list)
    paths: dict[str, dict[str, float]] = field(default_factory=dict)  # summed round deltas
    profile: dict[str, Any] = field(default_factory=dict)  # the last /props profile


def run_tools(
    plan: ToolsPlan,
    targets: Sequence[ToolsTarget],
    model: str,
    api_key: str | None,
    gpu: GpuMemoryProbe,
    ignore_eos: bool,
    on_round: Callable[[ToolsTarget, RoundRecord], None] | None = None,
) -> None:
    """Every round on every target, the targets interleaved (round k starts at target
    k mod n), so that all of them run under the same load."""
    for index, messages in enumerate(build_conversations(plan)):
        shift = index % len(targets)
        for target in [*targets[shift:], *targets[:shift]]:
            body = request_body(plan, messages, model, True, ignore_eos)
            record = _run_round(target, index, body, api_key, gpu)
            if on_round is not None:
                on_round(target, record)


def _run_round(
    target: ToolsTarget, index: int, body: dict[str, Any], api_key: str | None, gpu: GpuMemoryProbe
) -> RoundRecord:
    url = target.url
    profile = server_transfer_profile(url, api_key)
    before = fetch_metrics(url, api_key)
    out = stream_chat(url, body, api_key)
    after = fetch_metrics(url, api_key)
    target.profile = server_transfer_profile(url, api_key)
    add_round(target.paths, round_delta(profile, target.profile))
    rss = process_rss_bytes(target.pid) if target.pid is not None else None
    record = make_record(index, out, before, after, rss, gpu.used_bytes())
    target.records.append(record)
    return record


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
    p = subparsers.add_parser("tools", help="the 256K tool benchmark against running kvmem-servers")
    p.add_argument(
        "--url",
        action="append",
        default=None,
        help="server base URL (default http://127.0.0.1:8080); repeat it for several "
        "configurations, whose rounds then interleave",
    )
    p.add_argument("--model", default="kvmem", help="model name sent in requests")
    p.add_argument("--api-key", default=None)
    p.add_argument(
        "--label",
        action="append",
        default=None,
        help="configuration name (file names, summaries), one per --url (default kvmem)",
    )
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
        action="append",
        default=None,
        help="pid for RSS, one per --url (default: the local process listening on the URL's port)",
    )
    p.add_argument("--gpu-index", type=strict_int, default=0)
    p.add_argument(
        "--wait", type=strict_float, default=0.0, help="wait up to S seconds for /health"
    )
    p.add_argument("--out", default=None, metavar="DIR")
    p.set_defaults(handler=run)


def _targets(ns: argparse.Namespace) -> list[ToolsTarget]:
    urls = [u.rstrip("/") for u in (ns.url or ["http://127.0.0.1:8080"])]
    labels = ns.label or (["kvmem"] if len(urls) == 1 else [])
    pids = ns.server_pid or [None] * len(urls)
    if len(labels) != len(urls) or len(set(labels)) != len(labels):
        raise ConfigError("--label", "give one distinct --label per --url")
    if len(pids) != len(urls):
        raise ConfigError("--server-pid", "give one --server-pid per --url, or none")
    targets = []
    for url, label, pid in zip(urls, labels, pids, strict=True):
        if pid is None and url.rsplit(":", 1)[-1].isdigit():
            pid = listening_pid(int(url.rsplit(":", 1)[-1]))
        targets.append(ToolsTarget(label, url, pid))
    return targets


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
    targets = _targets(ns)
    if ns.wait > 0:
        for target in targets:
            wait_healthy(target.url, ns.wait, ns.api_key)
    out_dir = Path(ns.out) if ns.out else None
    logs: dict[str, TextIO] = {}
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        logs = {t.label: (out_dir / f"tools_{t.label}.jsonl").open("w") for t in targets}
    t0 = time.perf_counter()
    bar = stderr_bar(
        ns.progress_bar, total=(ns.rounds + 1) * len(targets), desc="tools", unit="round"
    )

    def on_round(target: ToolsTarget, record: RoundRecord) -> None:
        bar.update()
        logger.info("%s round %d: %s", target.label, record.round, record)
        if target.label in logs:
            logs[target.label].write(json.dumps(asdict(record)) + "\n")
            logs[target.label].flush()

    failure: KVMemError | None = None
    try:
        run_tools(
            plan,
            targets,
            ns.model,
            ns.api_key,
            GpuMemoryProbe(ns.gpu_index),
            ns.ignore_eos,
            on_round,
        )
    except KVMemError as exc:  # report the rounds that ran, then fail
        failure = exc
    finally:
        for log in logs.values():
            log.close()
    seconds = time.perf_counter() - t0
    reports = [_report(t, plan, out_dir, seconds) for t in targets if t.records]
    if reports:
        print()
        print(loop_table(reports))
    if failure is not None:
        raise failure
    return 0


def _report(
    target: ToolsTarget, plan: ToolsPlan, out_dir: Path | None, seconds: float
) -> LoopReport:
    """Print one target's tables, write its JSON and plot; its loop report."""
    summary = summarize_rounds(target.label, target.records)
    transfer = {k: v for k, v in target.profile.items() if k != STAGING}
    report = loop_report(summary, target.paths, target.profile.get(STAGING))
    print(round_table(target.records))
    print()
    print(summary_table([summary]))
    if transfer:
        print()
        print(transfer_table([(target.label, transfer)]))
    if out_dir is None:
        return report
    try:
        plot: Path | None = plot_rounds(
            target.records, target.label, out_dir / f"tools_{target.label}.png"
        )
    except ImportError as exc:  # matplotlib missing or broken: keep the numbers
        logger.warning("no plot: %s", exc)
        plot = None
    payload: dict[str, Any] = {
        "command": "tools",
        "label": target.label,
        "plan": plan,
        "url": target.url,
        "machine": machine_description(),
        "summary": summary,
        "loop": report,
        "transfer": transfer,
        "transfer_rounds": target.paths,
        "staging": target.profile.get(STAGING),
        "bandwidths": bandwidths(transfer) if transfer else {},
        "plot": str(plot) if plot is not None else None,
        "seconds": seconds,
    }
    path = write_json(out_dir, f"tools_{target.label}.json", payload)
    print(f"\nwrote {path}, {plot or 'no plot'} and tools_{target.label}.jsonl")
    return report
