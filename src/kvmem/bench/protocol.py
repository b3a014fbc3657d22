"""`kvmem-bench protocol`: the real-model quality protocol in one command, resumable.

    kvmem-bench protocol --preset cpu [--out DIR] [--jobs N] [--threads T] [--steps A,B] [--list]

Runs the preset's steps (`protocol_presets`): needle recall in each layout (document,
tools, agent loop, raw completion prompt; passkey and multikey), agent memory and
teacher-forced fidelity, every method in the same run. Each step is a `kvmem-bench`
command in its own process, writing DIR/STEP/{JSON, stdout.txt, progress.log}; `--jobs`
run side by side. A step whose JSON is complete is skipped, so running the command again
after a stop redoes only the unfinished steps (a needle step's checkpoint, written after
each case, says `"complete": false` until it ends). At the end the results are read back
into a table (stdout), DIR/summary.json and DIR/summary.png (`protocol_report`).
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kvmem.bench.protocol_presets import (
    PRESETS,
    Preset,
    Step,
    StepRun,
    is_complete,
    preset,
    step_json,
)
from kvmem.cli.kvmem_flags import strict_int
from kvmem.errors import ConfigError

logger = logging.getLogger(__name__)


def command(step: Step, out: Path) -> list[str]:
    """The step's process: this Python's `kvmem-bench`, with per-case progress on stderr."""
    main = [sys.executable, "-m", "kvmem.bench.main", "--progress"]
    return [*main, *step.args, "--out", str(out / step.name)]


def run_step(step: Step, out: Path, threads: int) -> StepRun:
    if is_complete(step_json(out, step)):
        logger.info("[%s] done already", step.name)
        return StepRun(step.name, "done", 0.0)
    folder = out / step.name
    folder.mkdir(parents=True, exist_ok=True)
    argv = command(step, out)
    env = os.environ | {"OMP_NUM_THREADS": str(threads)}
    logger.info("[%s] start: %s", step.name, " ".join(argv))
    t0 = time.perf_counter()
    with (folder / "stdout.txt").open("w") as stdout, (folder / "progress.log").open("w") as err:
        rc = subprocess.run(argv, stdout=stdout, stderr=err, env=env, check=False).returncode
    seconds = time.perf_counter() - t0
    if rc != 0 or not is_complete(step_json(out, step)):
        logger.error("[%s] FAILED (exit %d) after %.0f s: see %s", step.name, rc, seconds, err.name)
        return StepRun(step.name, "failed", seconds, rc or 1)
    logger.info("[%s] finished in %.0f s", step.name, seconds)
    return StepRun(step.name, "ran", seconds)


def selected(steps: list[Step], names: str | None) -> list[Step]:
    """The steps named in `--steps` (comma-separated, in the preset's order), or all."""
    if not names:
        return steps
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = sorted(set(wanted) - {s.name for s in steps})
    if not wanted:
        raise ConfigError("--steps", f"no step named in {names!r}")
    if unknown:
        raise ConfigError("--steps", f"unknown step(s) {', '.join(unknown)}; see --list")
    return [s for s in steps if s.name in wanted]


def run_protocol(
    chosen: Preset, out: Path, jobs: int, threads: int, names: str | None = None
) -> list[StepRun]:
    """The steps of `chosen` (all, or `names`; the unfinished ones run), `jobs` at a time."""
    steps = selected(chosen.steps(threads), names)
    out.mkdir(parents=True, exist_ok=True)
    if chosen.model and any(not is_complete(step_json(out, s)) for s in steps):
        from kvmem.models import resolve_model_flag

        resolve_model_flag(chosen.model, "-m")  # join a split model once, before the steps
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(lambda s: run_step(s, out, threads), steps))


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "protocol", help="the real-model quality protocol (needle, agent, fidelity), resumable"
    )
    p.add_argument("--preset", default="cpu", help="one of: " + ", ".join(PRESETS))
    p.add_argument("--out", default=None, metavar="DIR", help="(default: protocol-PRESET)")
    p.add_argument("--jobs", type=strict_int, default=None, help="steps at a time")
    p.add_argument("--threads", type=strict_int, default=None, help="-t of each step")
    p.add_argument("--steps", default=None, help="run only these steps (comma-separated)")
    p.add_argument("--list", action="store_true", help="list the steps and which are done")
    p.set_defaults(handler=run)


def run(ns: argparse.Namespace) -> int:
    from kvmem.bench.protocol_report import report

    chosen = preset(ns.preset)
    jobs = ns.jobs or chosen.jobs
    threads = ns.threads or chosen.threads
    if jobs <= 0 or threads <= 0:
        raise ConfigError("--jobs" if jobs <= 0 else "--threads", "must be positive")
    out = Path(ns.out or f"protocol-{chosen.name}")
    if ns.list:
        for step in chosen.steps(threads):
            state = "done" if is_complete(step_json(out, step)) else "todo"
            print(f"{state}  {step.name}")
        return 0
    t0 = time.perf_counter()
    runs = run_protocol(chosen, out, jobs, threads, ns.steps)
    failed = [r.name for r in runs if r.status == "failed"]
    print(report(chosen, out, runs, time.perf_counter() - t0))
    if failed:
        print(f"\nfailed steps: {', '.join(failed)} (run the command again to redo them)")
    return 1 if failed else 0
