"""What a tool loop's turns wait for (issue 34): reselection, restore blob builds, harvests.

`kvmem-bench tools` reads the server's transfer profile (`/props` `kvmem.transfer`,
kvmem.engine.transfer.transfer_profile) before and after every round and adds the
differences (`add_round`), so a profile cleared by an engine reset loses nothing. With the
run's summary (tools_records) that gives, per configuration:

- the reselection share of the wall time and overall / initial-computation prefill;
- the restores' blob build off the turn's path (`state_build_ahead`: built beside the
  prefill) and on it (`state_build`: built by the restore itself, `ahead_wait`: what a
  restore still waited for a build ahead), and that wait as a share of the restores' time
  on the turn's path (`state_build` + `ahead_wait` + `state_set`);
- the harvest reads (`state_get`: each waits for the decode that wrote its cells) and the
  harvest's whole time on the caller (`transfer_report.HARVEST`);
- the host buffers held at the end (`staging`: the staging buffer, sized by the largest
  harvest or restore blob, and the buffer of the blobs built ahead).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kvmem.bench.report import format_table
from kvmem.bench.tools_records import ToolsSummary, ratio
from kvmem.bench.transfer_report import HARVEST, Profile

STAGING = "staging"  # the held-buffer gauge of the profile (not a path)
_COUNTERS = ("calls", "ms", "bytes", "net_bytes")


def _number(value: float | int | None) -> float:
    return float(value or 0.0)


def round_delta(before: Profile, after: Profile) -> dict[str, dict[str, float]]:
    """Per path, what one round added: after minus before, or all of `after` when the
    path's calls went down (the engine's profile was cleared meanwhile)."""
    out: dict[str, dict[str, float]] = {}
    for name, now in after.items():
        if name == STAGING:
            continue
        was = before.get(name) or {}
        cleared = _number(now.get("calls")) < _number(was.get("calls"))
        base = {} if cleared else was
        out[name] = {k: _number(now.get(k)) - _number(base.get(k)) for k in _COUNTERS}
    return out


def add_round(total: dict[str, dict[str, float]], delta: Mapping[str, Mapping[str, float]]) -> None:
    """Add one round's `round_delta` into `total` (in place)."""
    for name, values in delta.items():
        into = total.setdefault(name, dict.fromkeys(_COUNTERS, 0.0))
        for k in _COUNTERS:
            into[k] += values.get(k, 0.0)


@dataclass(slots=True)
class LoopReport:
    label: str
    wall_s: float
    reselect_s: float | None
    reselect_share: float | None  # reselect_s / wall_s
    initial_prefill_tok_s: float | None
    overall_prefill_tok_s: float | None
    prefill_ratio: float | None  # overall / initial-computation prefill
    restore_ms: float  # on the turn's path: state_build + ahead_wait + state_set
    state_set_ms: float
    build_ahead_ms: float  # blobs built beside the prefill (off the turn's path)
    built_ahead_blocks: int
    build_on_path_ms: float  # state_build: blobs the restore built itself
    ahead_wait_ms: float  # what restores waited for builds ahead
    build_wait_ms: float  # build_on_path_ms + ahead_wait_ms
    build_wait_share: float | None  # build_wait_ms / restore_ms
    harvest_reads: int  # state_get calls
    harvest_read_ms: float  # state_get time (each read waits for its cells' decode)
    harvest_ms: float  # the harvest's whole time on the caller (transfer_report.HARVEST)
    harvested_bytes: int  # state_get bytes
    staging_bytes: int | None  # host buffers held at the end (staging + built ahead)


def loop_report(
    summary: ToolsSummary, paths: Mapping[str, Mapping[str, float]], staging: Mapping | None
) -> LoopReport:
    """The report of one configuration: its run's summary, its summed `round_delta`s and
    the `staging` gauge of its last profile."""

    def get(name: str, key: str = "ms") -> float:
        return _number((paths.get(name) or {}).get(key))

    build, wait, state_set = get("state_build"), get("ahead_wait"), get("state_set")
    restore = build + wait + state_set
    return LoopReport(
        label=summary.label,
        wall_s=summary.wall_s,
        reselect_s=summary.reselect_s,
        reselect_share=summary.reselect_share,
        initial_prefill_tok_s=summary.initial_prefill_tok_s,
        overall_prefill_tok_s=summary.overall_prefill_tok_s,
        prefill_ratio=ratio(summary.overall_prefill_tok_s, summary.initial_prefill_tok_s),
        restore_ms=restore,
        state_set_ms=state_set,
        build_ahead_ms=get("state_build_ahead"),
        built_ahead_blocks=int(get("state_build_ahead", "calls")),
        build_on_path_ms=build,
        ahead_wait_ms=wait,
        build_wait_ms=build + wait,
        build_wait_share=ratio(build + wait, restore),
        harvest_reads=int(get("state_get", "calls")),
        harvest_read_ms=get("state_get"),
        harvest_ms=sum(get(n) for n in HARVEST),
        harvested_bytes=int(get("state_get", "bytes")),
        staging_bytes=None if staging is None else int(_number(staging.get("bytes"))),
    )


def loop_table(reports: Sequence[LoopReport]) -> str:
    rows = [
        [
            r.label,
            r.wall_s,
            r.reselect_share,
            r.prefill_ratio,
            r.restore_ms,
            r.build_ahead_ms,
            r.build_wait_ms,
            r.build_wait_share,
            r.harvest_reads,
            r.harvest_read_ms,
            r.harvest_ms,
            None if r.staging_bytes is None else r.staging_bytes / 2**20,
        ]
        for r in reports
    ]
    head = [
        "config",
        "wall s",
        "reselect share",
        "overall/initial pf",
        "restore ms",
        "built ahead ms",
        "build waited ms",
        "build wait share",
        "harvest reads",
        "read ms",
        "harvest ms",
        "staging MiB",
    ]
    return format_table(head, rows, "tool loop: what the turns waited for")
