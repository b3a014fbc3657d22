"""kvmem-cli: one-shot and interactive generation with a KVMem session.

    kvmem-cli -p "What is KVMem?"                 # chat-formatted one-shot answer
    kvmem-cli -f prompt.txt --raw -n 200          # plain completion of a file
    kvmem-cli -i                                  # interactive multi-turn chat

All flags are validated (kvmem.cli.chat_cli) before the model loads; errors name the flag.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from kvmem.cli.chat_cli import build_parser, settings_from_args
from kvmem.errors import ConfigError, KVMemError


def main(argv: Sequence[str] | None = None) -> int:
    try:
        ns = build_parser().parse_args(argv)
        settings = settings_from_args(ns)
        from kvmem.gguf.model_path import resolve_model_path

        resolve_model_path(settings.model_path)
    except ConfigError as exc:
        print(f"kvmem-cli: error: {exc}", file=sys.stderr)
        return 2
    except KVMemError as exc:
        print(f"kvmem-cli: error: {exc}", file=sys.stderr)
        return 1
    logging.basicConfig(level=logging.INFO if ns.verbose else logging.WARNING, stream=sys.stderr)
    if not ns.verbose:
        logging.getLogger("llama_cpp.native").setLevel(logging.ERROR)
    from .chat_runner import ChatRunner  # loads llama.cpp

    try:
        runner = ChatRunner(ns, settings)
    except KVMemError as exc:
        print(f"kvmem-cli: error: {exc}", file=sys.stderr)
        return 1
    try:
        return runner.run()
    except KVMemError as exc:
        print(f"\nkvmem-cli: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        runner.close()


if __name__ == "__main__":
    sys.exit(main())
