"""`kvmem-bench summarize DIR`: saved benchmark logs to tables that compare configurations.

Reads every `*.json` written by the benchmark commands under DIR (recursively) and every
`tools_*.jsonl` round log that has no JSON beside it, and prints one table per kind.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from kvmem.bench.report import format_table
from kvmem.bench.tools_records import RoundRecord, ToolsSummary, summarize_rounds, summary_table
from kvmem.errors import ConfigError

logger = logging.getLogger(__name__)


def load_documents(root: Path) -> dict[str, list[tuple[Path, dict[str, Any]]]]:
    """command -> [(path, document)] for the benchmark JSON files under root."""
    docs: dict[str, list[tuple[Path, dict[str, Any]]]] = {}
    for path in sorted(root.rglob("*.json")):
        try:
            doc = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            logger.warning("skipping %s: %s", path, exc)
            continue
        if isinstance(doc, dict) and isinstance(doc.get("command"), str):
            docs.setdefault(doc["command"], []).append((path, doc))
    return docs


def tools_summaries(root: Path, docs: Sequence[tuple[Path, dict[str, Any]]]) -> list[ToolsSummary]:
    names = {f.name for f in fields(ToolsSummary)}
    out = [
        ToolsSummary(**{k: v for k, v in doc["summary"].items() if k in names}) for _, doc in docs
    ]
    seen = {path.with_suffix(".jsonl") for path, _ in docs}
    record_names = {f.name for f in fields(RoundRecord)}
    for log in sorted(root.rglob("tools_*.jsonl")):
        if log in seen:
            continue
        records = [
            RoundRecord(**{k: v for k, v in json.loads(line).items() if k in record_names})
            for line in log.read_text().splitlines()
            if line.strip()
        ]
        if records:
            out.append(
                summarize_rounds(log.stem.removeprefix("tools_") + " (partial log)", records)
            )
    return out


def needle_table(docs: Sequence[tuple[Path, dict[str, Any]]]) -> str:
    rows = []
    for path, doc in docs:
        for method, s in doc["summary"].items():
            rows.append(
                [path.parent.name or str(path), method, s["correct"], s["total"], s["accuracy"]]
            )
    return format_table(["run", "method", "correct", "total", "accuracy"], rows, "needle")


def fidelity_table(docs: Sequence[tuple[Path, dict[str, Any]]]) -> str:
    rows = []
    for path, doc in docs:
        for s in doc["overall"]:
            rows.append(
                [
                    path.parent.name or str(path),
                    s["method"],
                    s["scope"],
                    s["scored_tokens"],
                    s["mean_kl"],
                    s["p99_kl"],
                    s["top1_agreement"],
                    s["mean_coverage"],
                ]
            )
    return format_table(
        ["run", "method", "scope", "tokens", "mean KL", "p99 KL", "top1", "coverage"],
        rows,
        "fidelity",
    )


def agent_table(docs: Sequence[tuple[Path, dict[str, Any]]]) -> str:
    rows = []
    for path, doc in docs:
        for method, a in doc["accuracy"].items():
            rows.append(
                [
                    path.parent.name or str(path),
                    method,
                    a.get("single"),
                    a.get("multi"),
                    a.get("update"),
                    a.get("all"),
                ]
            )
    return format_table(["run", "method", "single", "multi", "update", "all"], rows, "agent")


def sweep_table(docs: Sequence[tuple[Path, dict[str, Any]]]) -> str:
    rows = []
    for path, doc in docs:
        for r in doc["results"]:
            name = "stock@window" if r["window"] else r["config"]
            rows.append(
                [
                    path.parent.name or str(path),
                    name,
                    r["context"],
                    r["prefill_tok_s"],
                    r["decode_tok_s"],
                    r["decode_ratio_vs_window"],
                ]
            )
    return format_table(
        ["run", "config", "context", "prefill tok/s", "decode tok/s", "decode / stock@window"],
        rows,
        "decode sweep",
    )


def summarize_dir(root: Path) -> str:
    if not root.is_dir():
        raise ConfigError("DIR", f"{root} is not a directory")
    docs = load_documents(root)
    parts = []
    tools = tools_summaries(root, docs.get("tools", []))
    if tools:
        parts.append(summary_table(tools))
    for command, render in (
        ("decode-sweep", sweep_table),
        ("fidelity", fidelity_table),
        ("needle", needle_table),
        ("agent", agent_table),
    ):
        if docs.get(command):
            parts.append(render(docs[command]))
    if not parts:
        return f"no benchmark logs under {root}"
    return "\n\n".join(parts)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("summarize", help="tables comparing saved benchmark logs")
    p.add_argument("dir", type=Path, metavar="DIR")
    p.set_defaults(handler=run)


def run(ns: argparse.Namespace) -> int:
    print(summarize_dir(ns.dir))
    return 0
