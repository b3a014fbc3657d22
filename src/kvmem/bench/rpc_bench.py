"""`kvmem-bench rpc`: prefill and decode with the layers on RPC workers against local, in
one run, with the bytes that crossed the network per token and per transfer path.

Without `--rpc` it starts `--workers N` kvmem-rpc-worker processes on loopback itself. For
each configuration (local, then over the workers) one engine with the same KVMem settings
processes the same prompt (prefill, one token generated) and then generates
`--gen-tokens` more (decode). The network bytes are the kernel's counters of the
connections to the workers (kvmem.engine.transfer.rpc_traffic); per path they come from the
transfer profile. The paper estimate for two machines adds, per token, the bytes over
the link's bandwidth and `ROUND_TRIPS_PER_WORKER` round trips per worker at its latency to
the loopback time (an assumption, printed with the numbers).
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kvmem.cli.kvmem_flags import strict_int
from kvmem.config import KVMemConfig
from kvmem.errors import ConfigError
from kvmem.models import resolve_model_flag
from kvmem.sampling import SamplingParams
from kvmem.settings.rpc_endpoints import LOOPBACK, RpcEndpoint
from kvmem.settings.values import rpc_workers

logger = logging.getLogger(__name__)

GREEDY = SamplingParams(temperature=0.0)
TEXT = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
ROUND_TRIPS_PER_WORKER = 2  # per decode step: the graph's inputs in, its outputs back
LINKS = {"1GbE": (125e6, 0.2e-3), "10GbE": (1.25e9, 0.05e-3)}  # bytes/s, round-trip s


@dataclass(slots=True)
class RunResult:
    name: str
    prefill_tokens: int
    prefill_tok_s: float
    decode_tokens: int
    decode_tok_s: float
    net_bytes_per_prefill_token: float
    net_bytes_per_decode_token: float
    tokens: list[int]
    paths: dict[str, dict[str, Any]] = field(default_factory=dict)


def _start_workers(n: int, base_port: int, threads: int, log_dir: Path) -> list[subprocess.Popen]:
    from kvmem.launch.workers import accepting

    procs = []
    for i in range(n):
        port = base_port + i
        log = (log_dir / f"rpc-worker-{port}.log").open("wb")
        argv = [sys.executable, "-m", "kvmem.console.rpc_worker", "--port", str(port)]
        procs.append(
            subprocess.Popen([*argv, "-t", str(threads)], stdout=log, stderr=subprocess.STDOUT)
        )
        deadline = time.monotonic() + 60
        while not accepting(RpcEndpoint(LOOPBACK, port)):
            if procs[-1].poll() is not None or time.monotonic() > deadline:
                for proc in procs:
                    proc.kill()
                raise ConfigError("--workers", f"the RPC worker on port {port} did not start")
            time.sleep(0.1)
    return procs


def _run(
    name: str, settings: Any, workers: tuple[RpcEndpoint, ...], ns: argparse.Namespace
) -> RunResult:
    from kvmem.engine.engine import Engine
    from kvmem.engine.transfer.rpc_traffic import NetworkMeter

    engine = Engine(settings)
    meter = NetworkMeter(workers) if workers else None
    try:
        text = TEXT * (ns.prompt_tokens // 8 + 8)
        prompt = engine.tokenize(text, add_special=True)[: ns.prompt_tokens]
        net0 = meter.total() if meter else 0
        first = list(engine.generate(prompt, sampling=GREEDY, max_tokens=1))
        pre = engine.last_turn
        net1, paths1 = (meter.total() if meter else 0), _path_net(engine)
        rest = list(
            engine.generate(
                prompt + first, sampling=GREEDY, max_tokens=ns.gen_tokens, ignore_eos=True
            )
        )
        dec = engine.last_turn
        # decode alone: less what the turn's paths (restore, harvest, prefill) moved
        net2 = (meter.total() if meter else 0) - (_path_net(engine) - paths1)
        return RunResult(
            name=name,
            prefill_tokens=pre.prefill_tokens,
            prefill_tok_s=pre.prefill_tokens / max(pre.prefill_ms, 1e-9) * 1e3,
            decode_tokens=dec.generated_tokens,
            decode_tok_s=dec.generated_tokens / max(dec.decode_ms, 1e-9) * 1e3,
            net_bytes_per_prefill_token=(net1 - net0) / max(pre.prefill_tokens, 1),
            net_bytes_per_decode_token=(net2 - net1) / max(dec.generated_tokens, 1),
            tokens=first + rest,
            paths=engine.transfer_profile(),
        )
    finally:
        engine.close()


def _path_net(engine: Any) -> int:
    return sum(int(t.get("net_bytes", 0) or 0) for t in engine.transfer_profile().values())


def paper_estimate(
    local: RunResult, remote: RunResult, n_workers: int
) -> dict[str, dict[str, float]]:
    """Decode and prefill tok/s on two machines: loopback time + bytes/bandwidth + RTTs."""
    out = {}
    for link, (bandwidth, rtt) in LINKS.items():
        decode_s = 1 / remote.decode_tok_s + remote.net_bytes_per_decode_token / bandwidth
        decode_s += ROUND_TRIPS_PER_WORKER * n_workers * rtt
        prefill_s = 1 / remote.prefill_tok_s + remote.net_bytes_per_prefill_token / bandwidth
        out[link] = {
            "decode_tok_s": 1 / decode_s,
            "prefill_tok_s": 1 / prefill_s,
            # the link's own share: what it adds per token to the loopback time
            "decode_net_ms_per_token": (decode_s - 1 / remote.decode_tok_s) * 1e3,
            "prefill_net_ms_per_token": (prefill_s - 1 / remote.prefill_tok_s) * 1e3,
        }
    return out


def run(ns: argparse.Namespace) -> dict[str, Any]:
    from kvmem.engine_settings import EngineSettings, GpuPlacement

    model = resolve_model_flag(ns.model, "-m")
    kvmem = KVMemConfig(budget=ns.budget, gen_reserve=ns.gen_reserve)
    procs: list[subprocess.Popen] = []
    workers: tuple[RpcEndpoint, ...] = tuple(ns.rpc)
    if not workers:
        log_dir = Path(ns.out or ".")
        log_dir.mkdir(parents=True, exist_ok=True)
        procs = _start_workers(ns.workers, ns.base_port, ns.worker_threads, log_dir)
        workers = tuple(RpcEndpoint(LOOPBACK, ns.base_port + i) for i in range(ns.workers))
    try:
        common = dict(
            model_path=model, n_ctx=ns.ctx_size, n_threads=ns.threads, kvmem=kvmem, seed=0
        )
        local = _run("local", EngineSettings(**common), (), ns)
        shares = tuple(1.0 for _ in workers)
        placement = GpuPlacement(tensor_split=shares, rpc=workers)
        remote = _run("rpc", EngineSettings(**common, placement=placement), workers, ns)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    return {
        "workers": [str(w) for w in workers],
        "settings": {"n_ctx": ns.ctx_size, "budget": ns.budget, "gen_reserve": ns.gen_reserve},
        "runs": [asdict(local), asdict(remote)],
        "identical_tokens": local.tokens == remote.tokens,
        "estimate": paper_estimate(local, remote, len(workers)),
        "estimate_assumes": {
            "links": {k: {"bytes_per_s": b, "rtt_s": r} for k, (b, r) in LINKS.items()},
            "round_trips_per_worker_per_token": ROUND_TRIPS_PER_WORKER,
        },
    }


def print_report(report: dict[str, Any]) -> None:
    print(
        f"workers: {', '.join(report['workers'])}; identical greedy tokens: {report['identical_tokens']}"
    )
    print(
        f"{'run':6} {'prefill tok/s':>14} {'decode tok/s':>13} {'net B/prefill tok':>18} {'net B/decode tok':>17}"
    )
    for r in report["runs"]:
        print(
            f"{r['name']:6} {r['prefill_tok_s']:14.1f} {r['decode_tok_s']:13.1f} "
            f"{r['net_bytes_per_prefill_token']:18.0f} {r['net_bytes_per_decode_token']:17.0f}"
        )
    remote = report["runs"][1]
    print("network bytes per path (rpc run):")
    for path, t in remote["paths"].items():
        if "net_bytes" in t:
            print(f"  {path:16} {t['net_bytes']:>12} B over {t['calls']} calls")
    for link, est in report["estimate"].items():
        print(
            f"estimate {link}: prefill {est['prefill_tok_s']:.1f} tok/s "
            f"(+{est['prefill_net_ms_per_token']:.2f} ms/token), decode "
            f"{est['decode_tok_s']:.1f} tok/s (+{est['decode_net_ms_per_token']:.2f} ms/token)"
        )


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("rpc", help="prefill/decode over RPC workers vs local, network bytes")
    p.add_argument("-m", "--model", default=None, metavar="PATH.gguf|NAME")
    p.add_argument(
        "--rpc",
        type=rpc_workers,
        default=(),
        metavar="HOST:PORT,...",
        help="running workers (default: start --workers on loopback)",
    )
    p.add_argument("--workers", type=strict_int, default=2, help="loopback workers to start")
    p.add_argument("--base-port", type=strict_int, default=50152)
    p.add_argument("--worker-threads", type=strict_int, default=1)
    p.add_argument("-c", "--ctx-size", type=strict_int, default=4096)
    p.add_argument("--budget", type=strict_int, default=1024)
    p.add_argument("--gen-reserve", type=strict_int, default=256)
    p.add_argument("--prompt-tokens", type=strict_int, default=2048)
    p.add_argument("--gen-tokens", type=strict_int, default=64)
    p.add_argument("-t", "--threads", type=strict_int, default=None)
    p.add_argument("--out", default=None, metavar="DIR")
    p.set_defaults(handler=main)


def main(ns: argparse.Namespace) -> int:
    report = run(ns)
    print_report(report)
    if ns.out:
        Path(ns.out, "rpc.json").write_text(json.dumps(report, indent=2))
    return 0
