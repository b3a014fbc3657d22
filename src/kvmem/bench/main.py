"""`kvmem-bench`: benchmarks, evaluations and the synthetic model writer.

Each subcommand prints a table and, with `--out DIR`, writes its JSON (and plots) there.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from kvmem.errors import KVMemError

logger = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    # The command modules are imported here, not at module level, so that
    # `kvmem-bench --help` stays cheap and each module's imports stay local.
    from kvmem.bench import (
        agent,
        decode_sweep,
        fidelity,
        lanes_bench,
        lookup_drafts,
        models_cli,
        mtp_overhead,
        needle,
        protocol,
        rpc_bench,
        score_cost,
        summarize,
        synth_cli,
        synth_mmproj_cli,
        tools_bench,
        transfer_copy,
        vision_bench,
    )

    parser = argparse.ArgumentParser(
        prog="kvmem-bench", description="KVMem benchmarks and evaluations."
    )
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="log more (-v info, -vv debug)"
    )
    parser.add_argument(
        "--progress",
        action="store_true",
        help="a progress line per case/turn on stderr (without llama.cpp's log)",
    )
    parser.add_argument(
        "--progress-bar",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a bar of the cases done on stderr (default: when stderr is a terminal)",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (
        synth_cli,
        synth_mmproj_cli,
        needle,
        fidelity,
        agent,
        tools_bench,
        decode_sweep,
        models_cli,
        lookup_drafts,
        mtp_overhead,
        summarize,
        vision_bench,
        lanes_bench,
        score_cost,
        transfer_copy,
        protocol,
        rpc_bench,
    ):
        module.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    level = (
        logging.WARNING if ns.verbose == 0 else logging.INFO if ns.verbose == 1 else logging.DEBUG
    )
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if ns.progress and level > logging.INFO:
        logging.getLogger("kvmem.bench").setLevel(logging.INFO)
    try:
        return int(ns.handler(ns))
    except KVMemError as exc:
        print(f"kvmem-bench {ns.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
