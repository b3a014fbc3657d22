"""scripts/gpu/grid33.sh without a GPU: its 47 steps, each variant's flags, the fidelity
chain's order and resumption, with a stand-in Python that records each command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu" / "grid33.sh"
VARIANTS = {
    "default": "",
    "s3584": " --kvmem-stream-tokens 3584",
    "b64-s3584": " --kvmem-block-tokens 64 --kvmem-stream-tokens 3584",
}
# -c (the script's is_done check) goes to the real Python; `-m kvmem.bench.main --progress
# SUB ... --out DIR` appends its arguments to $CALLS and writes DIR/SUB.json, complete.
FAKE = f"""#!/usr/bin/env bash
if [ "$1" = -c ]; then exec {sys.executable} "$@"; fi
sub=$4
out=${{@: -1}}
echo "$(basename "$out") ${{*:4}}" >> "$CALLS"
echo '{{"complete": true}}' > "$out/$sub.json"
"""


def run(tmp_path: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    fake = tmp_path / "python"
    fake.write_text(FAKE)
    fake.chmod(0o755)
    env = (
        os.environ
        | {
            "PYTHON": str(fake),
            "CALLS": str(tmp_path / "calls.txt"),
            "REF": str(tmp_path / "ref"),
            "JOBS": "3",
        }
        | extra
    )
    return subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path / "res")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )


def calls(tmp_path: Path) -> dict[str, str]:
    lines = (tmp_path / "calls.txt").read_text().splitlines()
    return dict(line.split(" ", 1) for line in lines)


def test_every_step_runs_once_with_its_variant_flags(tmp_path: Path) -> None:
    done = run(tmp_path)
    assert done.returncode == 0, done.stderr
    ran = calls(tmp_path)
    needle = {
        f"needle-{layout}-{length}-{v}"
        for layout in ("tools", "agent", "document")
        for length in (28672, 16384, 8192)
        for v in ("base", *VARIANTS)
    }
    agent = {f"agent-{final}-{v}" for final in ("user", "tool") for v in ("base", *VARIANTS)}
    fidelity = {f"fidelity-{v}" for v in VARIANTS}
    assert set(ran) == needle | agent | fidelity
    assert len(ran) == 47
    engine = (
        "-m /tmp/qwen.gguf -ngl all -t 2 -c 32768 --kvmem-budget 4096 "
        "--kvmem-gen-reserve 512 --kv-dtype f16"
    )
    grid = "--kinds passkey,multikey --seeds 2 --depths 5 --no-plots"
    for v, flags in VARIANTS.items():
        assert ran[f"needle-agent-28672-{v}"] == (
            f"needle {engine} {grid} --layouts agent --lengths 28672 --methods retrieval{flags} "
            f"--out {tmp_path}/res/needle-agent-28672-{v}"
        )
        assert ran[f"agent-tool-{v}"].endswith(
            f"--final tool --methods retrieval{flags} --out {tmp_path}/res/agent-tool-{v}"
        )
    assert " --methods full,recency,compact-rag --out " in ran["needle-document-8192-base"]
    assert "--kvmem-stream-tokens" not in ran["needle-document-8192-base"]
    ref = f"--target-tokens 28672 --reference-cache {tmp_path}/ref"
    assert f"{ref} --methods retrieval,recency --out" in ran["fidelity-default"]
    assert f"{ref} --methods retrieval --kvmem-stream-tokens 3584 --out" in ran["fidelity-s3584"]
    assert (tmp_path / "res" / "ALL_DONE").is_file()


def test_the_variants_fidelity_waits_for_the_reference(tmp_path: Path) -> None:
    assert run(tmp_path).returncode == 0
    order = [line.split(" ", 1)[0] for line in (tmp_path / "calls.txt").read_text().splitlines()]
    first = order.index("fidelity-default")
    assert order.index("fidelity-s3584") > first
    assert order.index("fidelity-b64-s3584") > first


def test_a_second_run_redoes_only_unfinished_steps(tmp_path: Path) -> None:
    assert run(tmp_path).returncode == 0
    (tmp_path / "res" / "needle-tools-8192-s3584" / "needle.json").write_text('{"complete": false}')
    (tmp_path / "calls.txt").unlink()
    again = run(tmp_path)
    assert again.returncode == 0, again.stderr
    assert list(calls(tmp_path)) == ["needle-tools-8192-s3584"]
    assert again.stdout.count("done already") == 46


def test_layouts_and_only_pick_the_raw_cells(tmp_path: Path) -> None:
    done = run(tmp_path, LAYOUTS="raw", ONLY="needle-raw", VARIANTS="default b64-s3584-df10")
    assert done.returncode == 0, done.stderr
    ran = calls(tmp_path)
    lengths, variants = (28672, 16384, 8192), ("base", "default", "b64-s3584-df10")
    assert set(ran) == {f"needle-raw-{n}-{v}" for n in lengths for v in variants}
    assert ran["needle-raw-8192-b64-s3584-df10"].endswith(
        "--layouts raw --lengths 8192 --methods retrieval --kvmem-block-tokens 64 "
        f"--kvmem-stream-tokens 3584 --kvmem-lexical-max-df 0.1 "
        f"--out {tmp_path}/res/needle-raw-8192-b64-s3584-df10"
    )
