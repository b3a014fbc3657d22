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

from kvmem.errors import ConfigError
from kvmem.models import resolve_model_flag
from kvmem.settings.flag import Program
from kvmem.settings.values import MAX_THREADS

from .flag_parser import FlagArgumentParser
from .flag_parser import build_parser as build_flag_parser
from .kvmem_flags import kvmem_config_from_args
from .spec_flags import spec_config_from_args

logger = logging.getLogger(__name__)


CliArgumentParser = FlagArgumentParser


def build_parser() -> argparse.ArgumentParser:
    """kvmem-cli's parser: the CLI rows of the flag table (kvmem.cli.flag_table)."""
    return build_flag_parser(
        Program.CLI,
        "kvmem-cli",
        "Generate with a KVMem session on llama.cpp.",
        fill_defaults=True,
        usage="%(prog)s [-m FNAME|NAME] [-c N] (-p TEXT | -f FNAME | -i) [FLAGS...]",
        epilog="Examples:\n"
        "  kvmem-cli -p 'Hello'                    # the embedded SmolLM2-135M-Instruct\n"
        "  kvmem-cli -m qwen-0.5b -f notes.txt     # a packaged model by name\n"
        "  kvmem-cli -i --kvmem-budget 2048        # interactive, a 2048-token KVMem window",
    )


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
        if value is not None and value > MAX_THREADS:
            raise ConfigError(flag, f"must be at most {MAX_THREADS}, got {value}")
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
    from kvmem.engine_settings import EngineSettings, GpuPlacement

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
        spec=spec_config_from_args(ns),  # --spec-* (declared on SpecConfig)
        placement=GpuPlacement(rpc=tuple(ns.rpc)),  # --rpc: remote devices join the split
    )
    settings.validate()
    return settings
