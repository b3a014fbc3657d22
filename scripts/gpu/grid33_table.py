"""The table of scripts/gpu/grid33.sh's run: needle cells, agent memory and fidelity.

    python3 scripts/gpu/grid33_table.py RES_DIR [VARIANT,...]   (default: default,s3584,b64-s3584)

Prints markdown: correct of 20 per (layout, length) for full, recency, compact-rag and the
retrieval variants (grid33.sh's VARIANTS; the first also ran recency's fidelity), with the cells where a variant falls short of the acceptance line
(>= full in document and tools, >= full - 1 in agent and raw) marked; agent memory correct of 21;
fidelity mean KL / top-1 over all turns and over the turns past the budget.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

VARIANTS = ("default", "s3584", "b64-s3584")
LAYOUTS = ("document", "tools", "agent", "raw")
SLACK = {"document": 0, "tools": 0, "agent": 1, "raw": 1}  # retrieval >= full - SLACK


def cells(res: Path) -> list[tuple[str, int]]:
    """The (layout, length) needle cells the run has, in LAYOUTS order, shortest first."""
    found = set()
    for d in res.glob("needle-*-*-base"):
        _, layout, length, _ = d.name.split("-", 3)
        found.add((LAYOUTS.index(layout), int(length)))
    return [(LAYOUTS[i], n) for i, n in sorted(found)]


def load(res: Path, step: str, name: str) -> dict | None:
    path = res / step / name
    if not path.is_file():
        return None
    doc = json.loads(path.read_text())
    return doc if doc.get("complete", True) else None


def correct(doc: dict | None, method: str, key: str = "summary") -> int | None:
    if doc is None or method not in doc.get(key, {}):
        return None
    return int(doc[key][method]["correct"])


def cell(value: int | None, floor: int | None = None) -> str:
    if value is None:
        return "—"
    return f"{value} ✗" if floor is not None and value < floor else str(value)


def needle_table(res: Path) -> list[str]:
    head = "| layout, length | full | recency | compact-rag | " + " | ".join(VARIANTS) + " |"
    rows = [head, "| --- |" + " ---: |" * (3 + len(VARIANTS))]
    for layout, length in cells(res):
        prefix = f"needle-{layout}-{length}"
        base = load(res, f"{prefix}-base", "needle.json")
        full = correct(base, "full")
        floor = None if full is None else full - SLACK[layout]
        ret = [correct(load(res, f"{prefix}-{v}", "needle.json"), "retrieval") for v in VARIANTS]
        base_cells = [cell(correct(base, m)) for m in ("full", "recency", "compact-rag")]
        line = [f"{layout} {length // 1024}K", *base_cells, *(cell(r, floor) for r in ret)]
        rows.append("| " + " | ".join(line) + " |")
    return rows


def agent_table(res: Path) -> list[str]:
    rows = ["| agent memory | full | recency | compact-rag | " + " | ".join(VARIANTS) + " |"]
    rows.append("| --- |" + " ---: |" * (3 + len(VARIANTS)))
    for final in ("user", "tool"):
        base = load(res, f"agent-{final}-base", "agent.json")
        line = [f"question as {final}"]
        line += [cell(correct(base, m, "accuracy")) for m in ("full", "recency", "compact-rag")]
        for v in VARIANTS:
            doc = load(res, f"agent-{final}-{v}", "agent.json")
            line.append(cell(correct(doc, "retrieval", "accuracy")))
        rows.append("| " + " | ".join(line) + " |")
    return rows


def fidelity_table(res: Path) -> list[str]:
    rows = ["| fidelity 28K | mean KL | top-1 | over budget: mean KL | top-1 | coverage |"]
    rows.append("| --- | ---: | ---: | ---: | ---: | ---: |")
    for v in VARIANTS:
        doc = load(res, f"fidelity-{v}", "fidelity.json")
        methods = ("retrieval", "recency") if v == VARIANTS[0] else ("retrieval",)
        for method in methods:
            if doc is None:
                rows.append(f"| {v} {method} | — | — | — | — | — |")
                continue
            by = {(s["method"], s["scope"]): s for s in doc["overall"]}
            if (method, "all") not in by:  # FID_RECENCY= left recency out
                continue
            a, o = by[(method, "all")], by[(method, "over_budget")]
            label = "recency" if method == "recency" else f"retrieval {v}"
            rows.append(
                f"| {label} | {a['mean_kl']:.3f} | {100 * a['top1_agreement']:.1f}% "
                f"| {o['mean_kl']:.3f} | {100 * o['top1_agreement']:.1f}% "
                f"| {a['mean_coverage']:.3f} |"
            )
    return rows


def main() -> int:
    global VARIANTS
    res = Path(sys.argv[1])
    if len(sys.argv) > 2:
        VARIANTS = tuple(sys.argv[2].split(","))
    for table in (needle_table(res), agent_table(res), fidelity_table(res)):
        print("\n".join(table) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
