"""The protocol's results read back from its steps' JSON: a table, summary.json, a plot.

Needle cells are (layout, length), both kinds together as in BRIEF §5's table ("of 20"):
correct/total per method, and the gap between
KVMem's retrieval and the compact-rag text baseline. Agent memory: correct/total per
method and question arrival. Fidelity: mean KL, p99 KL and top-1 agreement per method,
over all turns and over the turns past the budget; compact-rag has none (the reason is in
the output).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kvmem.bench.fidelity import FIDELITY_METHODS
from kvmem.bench.protocol_presets import NEEDLE_METHODS, Preset, StepRun, is_complete, step_json
from kvmem.bench.report import format_table, machine_description, write_json

Tally = dict[str, list[int]]  # method -> [correct, total]


def _load(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if is_complete(path) else None


def needle_rows(cases: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (layout, length) cell of needle cases (of any steps): correct/total per
    method, the kinds it holds, and retrieval's lead over compact-rag."""
    cells: dict[tuple[str, int], Tally] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    kinds: dict[tuple[str, int], set[str]] = defaultdict(set)
    for case in cases:
        key = (case["layout"], case["length"])
        tally = cells[key][case["method"]]
        tally[0] += int(case["correct"])
        tally[1] += 1
        kinds[key].add(case["kind"])
    return [
        _needle_row(layout, "+".join(sorted(kinds[(layout, length)])), length, tally)
        for (layout, length), tally in cells.items()
    ]


def collect(chosen: Preset, out: Path) -> dict[str, Any]:
    """The figures of every complete step (missing steps are listed, not guessed)."""
    cases: list[dict[str, Any]] = []
    agent: list[dict[str, Any]] = []
    fidelity: list[dict[str, Any]] = []
    missing: list[str] = []
    for step in chosen.steps():
        doc = _load(step_json(out, step))
        if doc is None:
            missing.append(step.name)
        elif step.json == "needle.json":
            cases += doc["cases"]
        elif step.json == "agent.json":
            final = doc["settings"]["final"]
            for method, acc in doc["accuracy"].items():
                agent.append({"final": final, "method": method} | _counts(acc))
        else:
            fidelity += [
                {k: s[k] for k in ("method", "scope", "turns", "mean_kl", "p99_kl")}
                | {"top1": s["top1_agreement"], "tokens": doc["transcript"]["final_prompt_tokens"]}
                for s in doc["overall"]
            ]
    return {"needle": needle_rows(cases), "agent": agent, "fidelity": fidelity, "missing": missing}


def _counts(acc: dict[str, Any]) -> dict[str, int]:
    return {"correct": int(acc["correct"]), "total": int(acc["total"])}


def _needle_row(layout: str, kinds: str, length: int, tally: Tally) -> dict[str, Any]:
    row: dict[str, Any] = {"layout": layout, "kinds": kinds, "length": length}
    row |= {m: {"correct": c, "total": n} for m, (c, n) in tally.items()}
    if "retrieval" in tally and "compact-rag" in tally:
        row["retrieval_minus_compact_rag"] = tally["retrieval"][0] - tally["compact-rag"][0]
    return row


def _ratio(entry: dict[str, int] | None) -> str | None:
    return f"{entry['correct']}/{entry['total']}" if entry else None


def tables(figures: dict[str, Any]) -> str:
    parts = []
    if figures["needle"]:
        rows = [
            [f"{r['layout']} {r['length']}"]
            + [_ratio(r.get(m)) for m in NEEDLE_METHODS]
            + [r.get("retrieval_minus_compact_rag")]
            for r in figures["needle"]
        ]
        headers = ["needle cell", *NEEDLE_METHODS, "retrieval - compact-rag"]
        parts.append(format_table(headers, rows, "needle recall (correct/total)"))
    if figures["agent"]:
        rows = [[r["final"], r["method"], f"{r['correct']}/{r['total']}"] for r in figures["agent"]]
        parts.append(format_table(["question as", "method", "correct"], rows, "agent memory"))
    if figures["fidelity"]:
        rows = [
            [r["method"], r["scope"], r["turns"], r["mean_kl"], r["p99_kl"], r["top1"]]
            for r in figures["fidelity"]
        ]
        headers = ["method", "scope", "turns", "mean KL", "p99 KL", "top-1"]
        title = f"fidelity (teacher-forced, {figures['fidelity'][0]['tokens']} tokens)"
        parts.append(format_table(headers, rows, title) + f"\ncompact-rag: {FIDELITY_METHODS}")
    if figures["missing"]:
        parts.append("steps without a complete result: " + ", ".join(figures["missing"]))
    return "\n\n".join(parts)


def report(chosen: Preset, out: Path, runs: Sequence[StepRun], seconds: float) -> str:
    """The table; writes OUT/summary.json and OUT/summary.png."""
    figures = collect(chosen, out)
    plot = plot_summary(figures, out / "summary.png")
    payload = {
        "command": "protocol",
        "preset": asdict(chosen) | {"compression": chosen.compression},
        "machine": machine_description(),
        "steps": [asdict(r) for r in runs],
        "seconds": seconds,
        "excluded": {"fidelity/compact-rag": FIDELITY_METHODS},
        "plot": str(plot) if plot else None,
    } | figures
    path = write_json(out, "summary.json", payload)
    return tables(figures) + f"\n\nwrote {path}" + (f" and {plot}" if plot else "")


def plot_summary(figures: dict[str, Any], path: Path) -> Path | None:
    """Accuracy per needle cell and agent-memory arrival, one bar per method."""
    groups = [
        (f"{r['layout']}\n{r['length']}", {m: r.get(m) for m in NEEDLE_METHODS})
        for r in figures["needle"]
    ]
    by_final: dict[str, dict[str, Any]] = defaultdict(dict)
    for r in figures["agent"]:
        by_final[r["final"]][r["method"]] = r
    groups += [(f"agent\n{final}", tally) for final, tally in by_final.items()]
    if not groups:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6.0, 1.4 * len(groups)), 4.0))
    width = 0.8 / len(NEEDLE_METHODS)
    for j, method in enumerate(NEEDLE_METHODS):
        xs = [i + (j - (len(NEEDLE_METHODS) - 1) / 2) * width for i in range(len(groups))]
        ys = [_accuracy(tally.get(method)) for _, tally in groups]
        ax.bar(xs, ys, width, label=method)
    ax.set_xticks(range(len(groups)), [name for name, _ in groups], fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("accuracy")
    ax.legend(fontsize=8, ncols=len(NEEDLE_METHODS))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _accuracy(entry: dict[str, int] | None) -> float:
    return entry["correct"] / entry["total"] if entry and entry["total"] else 0.0
