"""`kvmem-bench mtp-overhead`: decode with MTP drafts (--spec-type draft-mtp) against decode
without drafts, in one run, on one model (loaded once, with its nextn layer).

Meant for a synthetic qwen35 with `--nextn-layers 1` (random weights): its MTP head's drafts
are (nearly) never accepted, so the measured slowdown is what draft-mtp costs at zero
acceptance. A step with a draft costs the catch-up of the draft context over the rows of
the steps before it, n_draft single-row draft decodes of the nextn layer, and the
verification of the rejected drafts (a batch of 1 + n_draft rows, and on a hybrid the
recurrent-state snapshot and rewind); with the draft gate (default on) most steps are kept
plain, and those cost a row copy (the draft context decodes nothing then). Both runs go
through the KVMem session (the same window settings); the greedy outputs must be identical.
`--gate closed` keeps every step plain, so the ratio is what following the target alone
costs (1.0 is the goal); `--gate off` drafts every step. `--repeat N` runs each mode N
times, interleaved, and keeps the fastest decode of each (for noisy machines). The table's
"kept plain" counts the steps the gate did not draft, "draft decodes" the draft context's
llama_decode calls (prefill chunks included).
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING

from kvmem.bench.report import add_run_arguments, format_table, machine_description, write_json
from kvmem.cli.kvmem_flags import strict_int
from kvmem.config import KVMemConfig
from kvmem.engine.spec.draft_gate import DraftGate
from kvmem.engine_settings import EngineSettings
from kvmem.errors import ConfigError
from kvmem.gguf.model_path import resolve_model_path
from kvmem.gguf.nextn_meta import check_mtp_head
from kvmem.sampling import SamplingParams
from kvmem.spec_config import SPEC_KV_TYPES, SpecConfig, SpecType

if TYPE_CHECKING:
    from kvmem.engine.engine import Engine

GREEDY = SamplingParams(temperature=0.0)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "mtp-overhead", help="decode tok/s with draft-mtp vs without drafts (same run)"
    )
    p.add_argument("-m", "--model", required=True, metavar="PATH.gguf", help="with a nextn layer")
    p.add_argument("--prompt-tokens", type=strict_int, default=1024)
    p.add_argument("--max-tokens", type=strict_int, default=256)
    p.add_argument("--n-draft", type=strict_int, default=3, help="--spec-draft-n-max")
    p.add_argument("--spec-kv-dtype", choices=sorted(SPEC_KV_TYPES), default="f16")
    p.add_argument("-c", "--ctx-size", type=strict_int, default=8192)
    p.add_argument("--budget", type=strict_int, default=4096, help="--kvmem-budget")
    p.add_argument("--gen-reserve", type=strict_int, default=1024, help="--kvmem-gen-reserve")
    p.add_argument(
        "--repeat", type=strict_int, default=1, help="runs of each, interleaved; the fastest kept"
    )
    p.add_argument(
        "--gate",
        choices=("on", "off", "closed"),
        default="on",
        help="the draft gate: on (--spec-gate, the default), off (every step drafts), "
        "closed (no step drafts: what following the target costs)",
    )
    add_run_arguments(p)
    p.set_defaults(handler=run)


def _prompt(n: int, n_vocab: int) -> list[int]:
    return [1 + (7919 * i + 13) % (n_vocab - 2) for i in range(n)]


class ClosedGate(DraftGate):
    """A draft gate that keeps every step plain (`--gate closed`)."""

    def wants_draft(self) -> bool:
        self.steps += 1
        self.skipped += 1
        return False


def _decode(
    engine: Engine, prompt: list[int], max_tokens: int, closed: bool
) -> tuple[list[int], dict]:
    """One greedy turn on a fresh engine: its output and decode numbers."""
    if closed and engine.session.spec is not None:
        engine.session.spec.gate = ClosedGate()
    try:
        out = list(engine.generate(prompt, sampling=GREEDY, max_tokens=max_tokens))
        st = engine.last_turn
        gate = engine.session.spec.gate if engine.session.spec is not None else None
        draft_decodes = engine.mtp.n_decodes if engine.mtp is not None else 0
    finally:
        engine.close()
    tps = st.generated_tokens / (st.decode_ms / 1000.0) if st.decode_ms else 0.0
    return out, {
        "tokens": st.generated_tokens,
        "decode_ms": st.decode_ms,
        "tok_s": tps,
        "prefill_ms": st.prefill_ms,
        "draft_n": st.draft_n,
        "draft_n_accepted": st.draft_n_accepted,
        "gate_skipped": gate.skipped if gate is not None else 0,
        "draft_decodes": draft_decodes,
    }


def run(ns: argparse.Namespace) -> int:
    for flag, value in (
        ("--max-tokens", ns.max_tokens),
        ("--prompt-tokens", ns.prompt_tokens),
        ("--repeat", ns.repeat),
    ):
        if value <= 0:
            raise ConfigError(flag, f"must be positive, got {value}")
    path = resolve_model_path(ns.model)
    check_mtp_head(path)
    spec = SpecConfig(
        SpecType.MTP, ns.n_draft, SPEC_KV_TYPES[ns.spec_kv_dtype], gate=ns.gate != "off"
    )
    spec.validate()
    base = EngineSettings(
        model_path=path,
        n_ctx=ns.ctx_size,
        n_batch=ns.batch_size,
        n_ubatch=min(512, ns.batch_size),
        n_threads=ns.threads,
        n_gpu_layers=ns.gpu_layers,
        kvmem=KVMemConfig(budget=ns.budget, gen_reserve=ns.gen_reserve),
    )
    from kvmem.engine.engine import Engine  # loads llama.cpp
    from kvmem.engine.llama.model import LlamaModel

    model = LlamaModel(path, ns.gpu_layers, load_mtp=True)
    runs: dict[str, dict] = {}
    outputs: dict[str, list[int]] = {}
    repeatable = True  # every run of a mode gave the same output
    try:
        prompt = _prompt(ns.prompt_tokens, model.describe(ns.ctx_size).n_vocab)
        for _ in range(ns.repeat):
            for name, settings in (
                ("plain", base),
                ("draft-mtp", dataclasses.replace(base, spec=spec)),
            ):
                engine = Engine(settings, model=model)
                out, result = _decode(engine, prompt, ns.max_tokens, ns.gate == "closed")
                repeatable = repeatable and outputs.setdefault(name, out) == out
                if name not in runs or result["decode_ms"] < runs[name]["decode_ms"]:
                    runs[name] = result
    finally:
        model.close()
    identical = repeatable and outputs["plain"] == outputs["draft-mtp"]
    plain, mtp = runs["plain"], runs["draft-mtp"]
    ratio = mtp["tok_s"] / plain["tok_s"] if plain["tok_s"] else 0.0
    acceptance = mtp["draft_n_accepted"] / mtp["draft_n"] if mtp["draft_n"] else 0.0
    rows = [
        [
            name,
            r["tokens"],
            r["decode_ms"] / 1000.0,
            r["tok_s"],
            r["draft_n"],
            r["draft_n_accepted"],
            r["gate_skipped"],
            r["draft_decodes"],
        ]
        for name, r in runs.items()
    ]
    headers = ["decoding", "tokens", "seconds", "tok/s", "drafted", "accepted", "kept plain"]
    headers.append("draft decodes")
    title = (
        f"prompt {ns.prompt_tokens} tokens, greedy, n_draft {ns.n_draft}, {ns.spec_kv_dtype}, "
        f"gate {ns.gate}, fastest of {ns.repeat}"
    )
    print(format_table(headers, rows, title=title))
    print(
        f"identical: {identical}  draft-mtp/plain decode: {ratio:.3f}x  "
        f"acceptance: {acceptance:.1%}"
    )
    payload = {
        "command": "mtp-overhead",
        "model": path,
        "settings": {k: v for k, v in vars(ns).items() if k != "handler"},
        "machine": machine_description(),
        "identical": identical,
        "decode_ratio": ratio,
        "acceptance": acceptance,
        "runs": runs,
    }
    out = write_json(ns.out, "mtp_overhead.json", payload)
    if out is not None:
        print(f"wrote {out}")
    return 0 if identical else 1
