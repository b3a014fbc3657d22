"""kvmem-cli: one-shot and interactive generation with a KVMem session.

    kvmem-cli -p "What is KVMem?"                 # chat-formatted one-shot answer
    kvmem-cli -f prompt.txt --raw -n 200          # plain completion of a file
    kvmem-cli -i                                  # interactive multi-turn chat

All flags are validated before the model loads; errors name the flag.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from kvmem.errors import ConfigError, KVMemError
from kvmem.models import resolve_model_flag

from .kvmem_flags import (
    add_kv_cache_arguments,
    add_kvmem_arguments,
    kvmem_config_from_args,
    strict_float,
    strict_int,
)
from .spec_flags import add_spec_arguments, spec_config_from_args

logger = logging.getLogger(__name__)


class CliArgumentParser(argparse.ArgumentParser):
    """argparse that raises ConfigError instead of exiting, so main() reports it once."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError("", message)


def build_parser() -> argparse.ArgumentParser:
    p = CliArgumentParser(
        prog="kvmem-cli", description="Generate with a KVMem session on llama.cpp."
    )
    p.add_argument(
        "-m",
        "--model",
        default=None,
        help="GGUF model file or a model name (qwen-0.5b) (default: the embedded SmolLM2-135M-Instruct)",
    )
    p.add_argument(
        "-c",
        "--ctx-size",
        type=strict_int,
        default=0,
        help="logical context in tokens (default: the model's)",
    )
    p.add_argument("-p", "--prompt", default=None, help="prompt text")
    p.add_argument("-f", "--file", default=None, help="read the prompt from a file")
    p.add_argument(
        "-n",
        "--n-predict",
        "--predict",
        dest="n_predict",
        type=strict_int,
        default=-1,
        help="tokens to generate, -1 = until end of generation (default: -1)",
    )
    p.add_argument(
        "--temp", type=strict_float, default=0.8, help="temperature, 0 = greedy (default: 0.8)"
    )
    p.add_argument("--top-k", type=strict_int, default=40)
    p.add_argument("--top-p", type=strict_float, default=0.95)
    p.add_argument("--min-p", type=strict_float, default=0.05)
    p.add_argument("--repeat-penalty", type=strict_float, default=1.0)
    p.add_argument("-s", "--seed", type=strict_int, default=-1, help="RNG seed, -1 = random")
    p.add_argument(
        "--ignore-eos", action="store_true", help="keep generating past end-of-generation tokens"
    )
    p.add_argument(
        "--raw", action="store_true", help="use the prompt as is, without the chat template"
    )
    p.add_argument("-sys", "--system-prompt", default=None, help="system message for chat mode")
    p.add_argument("-i", "--interactive", action="store_true", help="multi-turn chat on stdin")
    p.add_argument("-t", "--threads", type=strict_int, default=None)
    p.add_argument("-tb", "--threads-batch", type=strict_int, default=None)
    p.add_argument("-b", "--batch-size", type=strict_int, default=2048)
    p.add_argument("-ub", "--ubatch-size", type=strict_int, default=512)
    p.add_argument(
        "-ngl",
        "--gpu-layers",
        "--n-gpu-layers",
        dest="gpu_layers",
        default="all",
        help="layers on the GPU: N, all or auto (default: all)",
    )
    p.add_argument("-fa", "--flash-attn", choices=["on", "off", "auto"], default="on")
    p.add_argument("-v", "--verbose", action="store_true", help="show llama.cpp's log")
    add_kv_cache_arguments(p)
    add_kvmem_arguments(p)
    add_spec_arguments(p)  # speculative decoding (spec_flags.py)
    return p


def _check(ns: argparse.Namespace) -> None:
    if ns.ctx_size < 0:
        raise ConfigError("-c", f"context size must be positive, got {ns.ctx_size}")
    if ns.n_predict == 0 or ns.n_predict < -1:
        raise ConfigError("-n", f"must be -1 or a positive number, got {ns.n_predict}")
    if ns.temp < 0:
        raise ConfigError("--temp", f"must be >= 0, got {ns.temp}")
    for flag, value in (("-t", ns.threads), ("-tb", ns.threads_batch)):
        if value is not None and value <= 0:
            raise ConfigError(flag, f"must be a positive number, got {value}")
    if ns.batch_size <= 0:
        raise ConfigError("-b", f"must be a positive number, got {ns.batch_size}")
    if ns.ubatch_size <= 0:
        raise ConfigError("-ub", f"must be a positive number, got {ns.ubatch_size}")
    if ns.prompt is not None and ns.file is not None:
        raise ConfigError("-f", "give either -p or -f, not both")
    if ns.file is not None and not os.path.isfile(ns.file):
        raise ConfigError("-f", f"prompt file not found: {ns.file}")


def parse_gpu_layers(value: str) -> int:
    if value in ("all", "auto"):
        return -1
    try:
        n = int(value)
    except ValueError:
        raise ConfigError("-ngl", f"expected a number, 'all' or 'auto', got {value!r}") from None
    if n < 0:
        raise ConfigError("-ngl", f"must be >= 0, got {n}")
    return n


def settings_from_args(ns: argparse.Namespace):
    """Validate everything and build EngineSettings (no model is loaded here)."""
    from kvmem.engine import EngineSettings

    _check(ns)
    flags = kvmem_config_from_args(
        ns, trace_env=os.environ.get("KVMEM_TRACE", "0") not in ("", "0")
    )
    model = resolve_model_flag(ns.model, "-m")  # a catalog name -> its joined GGUF
    if model is not None and not os.path.isfile(model):
        raise ConfigError("-m", f"model file not found: {model}")
    settings = EngineSettings(
        model_path=model,
        n_ctx=ns.ctx_size,
        n_batch=ns.batch_size,
        n_ubatch=ns.ubatch_size,
        n_threads=ns.threads,
        n_threads_batch=ns.threads_batch,
        n_gpu_layers=parse_gpu_layers(ns.gpu_layers),
        flash_attn=ns.flash_attn != "off",
        cache_types=flags.cache_types,
        kvmem=flags.kvmem,
        seed=ns.seed,
        spec=spec_config_from_args(ns),
    )
    settings.validate()
    return settings


def main(argv: Sequence[str] | None = None) -> int:
    try:
        ns = build_parser().parse_args(argv)
        settings = settings_from_args(ns)
        from kvmem.engine import resolve_model_path

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
    from .chat_runner import ChatRunner

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
