"""The data-movement profile (kvmem.engine.transfer.transfer_profile) as a table: per transfer path
its GB/s and time, the end-to-end harvest and restore bandwidths, and the eval-callback
calls. Printed by `decode-sweep` (per point) and `tools` (the server's /props)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kvmem.bench.report import format_table

Profile = Mapping[str, Mapping[str, float | int | None]]

PATHS = (
    "state_get",
    "state_split",
    "copy_out",
    "copy_wait",
    "store_put",
    "state_build",
    "staging_grow",  # part of state_get / state_build: (re)allocating the pinned buffer
    "state_build_ahead",  # restore blobs built beside the prefill (not waited for)
    "ahead_wait",  # what a restore still waited for such a build
    "state_set",
    "prefill_decode",  # llama_decode of the prefill chunks
    "prefill_gap",  # the caller between those decodes (includes harvest and eviction)
    "scoring_decode",  # --kvmem-query-source scoring: the query spans on the small context
)
# the time harvest holds the caller: copy_out runs on the copy threads, copy_wait is the
# part of it the caller waited for (all of it without copy threads)
HARVEST = ("state_get", "state_split", "copy_wait", "store_put")
# the time restore holds the caller (a blob built ahead counts only for its wait)
RESTORE = ("state_build", "ahead_wait", "state_set")


def path_gb_s(profile: Profile, names: Sequence[str], bytes_from: str) -> float | None:
    """Bytes of `bytes_from` over the summed time of `names`, in GB/s."""
    ms = sum(float((profile.get(n) or {}).get("ms") or 0.0) for n in names)
    n_bytes = int((profile.get(bytes_from) or {}).get("bytes") or 0)
    return n_bytes / (ms * 1e6) if ms > 0 and n_bytes > 0 else None


def bandwidths(profile: Profile) -> dict[str, float | None]:
    """End-to-end harvest and restore GB/s."""
    return {
        "harvest_gb_s": path_gb_s(profile, HARVEST, "state_get"),
        "restore_gb_s": path_gb_s(profile, RESTORE, "state_set"),
    }


def _cell(p: Mapping[str, float | int | None] | None) -> str:
    if not p:
        return "-"
    rate = p.get("gb_s")
    ms = float(p.get("ms") or 0.0)
    return f"{rate:.2f} ({ms:.0f} ms)" if rate else f"{ms:.0f} ms"


def transfer_table(entries: Sequence[tuple[str, Profile]]) -> str:
    rows = []
    for label, profile in entries:
        if not profile:
            continue
        bw = bandwidths(profile)
        rows.append(
            [
                label,
                *(_cell(profile.get(n)) for n in PATHS),
                bw["harvest_gb_s"],
                bw["restore_gb_s"],
                (profile.get("capture") or {}).get("calls", 0),
            ]
        )
    head = ["run", *(f"{n} GB/s (ms)" for n in PATHS)]
    return format_table(
        [*head, "harvest GB/s", "restore GB/s", "eval-callback calls"], rows, "transfer profile"
    )
