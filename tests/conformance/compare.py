"""Compare two runs of llama.cpp's server suite (the JSON that `suite.py --json` writes).

    python tests/conformance/compare.py REFERENCE.json CANDIDATE.json [--names A B]

Prints a Markdown table of passed/failed/skipped per test file for both runs, the totals,
and the tests one run passes and the other does not (failed, error or skipped there).
Exit status 1 when the candidate passes fewer tests than the reference.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(slots=True)
class FileCounts:
    """One test file's outcomes in one run."""

    passed: int = 0
    failed: int = 0  # failures and errors
    skipped: int = 0

    def add(self, outcome: str) -> None:
        if outcome == "passed":
            self.passed += 1
        elif outcome == "skipped":
            self.skipped += 1
        else:
            self.failed += 1

    def cell(self) -> str:
        return f"{self.passed} / {self.failed} / {self.skipped}"


@dataclass(slots=True)
class Run:
    """One run's outcomes: test id (`test_file::test_name`) -> outcome."""

    outcomes: dict[str, str]
    by_file: dict[str, FileCounts] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for test, outcome in self.outcomes.items():
            self.by_file.setdefault(file_of(test), FileCounts()).add(outcome)

    @property
    def passed(self) -> int:
        return Counter(self.outcomes.values())["passed"]

    def total(self) -> FileCounts:
        out = FileCounts()
        for outcome in self.outcomes.values():
            out.add(outcome)
        return out


def file_of(test: str) -> str:
    return test.split("::", 1)[0]


def load_run(path: Path) -> Run:
    rows = json.loads(path.read_text())
    return Run({row["test"]: row["outcome"] for row in rows})


def only_passed_by(winner: Run, other: Run) -> list[str]:
    """Tests `winner` passes that `other` does not pass (or did not run)."""
    return sorted(
        t for t, o in winner.outcomes.items() if o == "passed" and other.outcomes.get(t) != "passed"
    )


def table(reference: Run, candidate: Run, names: tuple[str, str]) -> list[str]:
    lines = [
        f"| file | {names[0]} passed / failed / skipped | {names[1]} passed / failed / skipped |",
        "|---|---:|---:|",
    ]
    for name in sorted(set(reference.by_file) | set(candidate.by_file)):
        ref = reference.by_file.get(name, FileCounts())
        cand = candidate.by_file.get(name, FileCounts())
        lines.append(f"| {name} | {ref.cell()} | {cand.cell()} |")
    lines.append(f"| **all** | **{reference.total().cell()}** | **{candidate.total().cell()}** |")
    return lines


def report(reference: Run, candidate: Run, names: tuple[str, str]) -> list[str]:
    lines = table(reference, candidate, names)
    for winner, other, (a, b) in (
        (reference, candidate, names),
        (candidate, reference, names[::-1]),
    ):
        tests = only_passed_by(winner, other)
        lines += ["", f"Passed by {a}, not by {b} ({len(tests)}):"]
        lines += [f"- {t} ({b}: {other.outcomes.get(t, 'not run')})" for t in tests]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reference", type=Path)
    parser.add_argument("candidate", type=Path)
    parser.add_argument("--names", nargs=2, default=["llama-server", "kvmem-server"])
    args = parser.parse_args()
    reference, candidate = load_run(args.reference), load_run(args.candidate)
    print("\n".join(report(reference, candidate, tuple(args.names))))
    raise SystemExit(0 if candidate.passed >= reference.passed else 1)


if __name__ == "__main__":
    main()
