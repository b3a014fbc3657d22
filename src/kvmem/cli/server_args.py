"""kvmem-server's command line: llama-server's flags, `LLAMA_ARG_*` variables, validation.

Precedence is CLI > environment > default. Environment values are parsed and validated
first, so an invalid one fails even when a flag overrides it. Everything here runs before
the model loads; errors are `ConfigError`s naming the flag or variable.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvmem import __version__
from kvmem.cli import arg_types as t
from kvmem.cli.compat_flags import add_compat_arguments, host_list, parallel_slots, reasoning_format
from kvmem.cli.env_args import MISSING, EnvBinding, check_env_names, read_env_value, supported_names
from kvmem.cli.kvmem_flags import add_kv_cache_arguments, add_kvmem_arguments
from kvmem.errors import ConfigError
from kvmem.memory.ggml_types import parse_kv_type
from kvmem.server import limits as lim

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class FlagSpec:
    flags: tuple[str, ...]
    dest: str
    help: str
    parse: Any = None  # value parser; None: a boolean switch
    default: Any = None
    env: str | None = None
    negative: tuple[str, ...] = ()  # --no-x forms of a switch
    append: bool = False
    metavar: str | None = None
    shown_default: str | None = None  # how --help shows the default


F = FlagSpec
# fmt: off
SERVER_FLAGS: tuple[FlagSpec, ...] = (
    F(("-m", "--model"), "model", "GGUF model file or a model name (qwen-0.5b)", t.non_empty, None, "LLAMA_ARG_MODEL",
      metavar="FNAME", shown_default="the embedded SmolLM2-135M-Instruct"),
    F(("-a", "--alias"), "alias", "model name in /v1/models", t.non_empty, None, "LLAMA_ARG_ALIAS",
      metavar="NAME", shown_default="the model file name"),
    F(("-c", "--ctx-size"), "ctx_size", "logical context size in tokens", t.ctx_size, None,
      "LLAMA_ARG_CTX_SIZE", metavar="N", shown_default="the model's training context"),
    F(("-n", "--n-predict", "--predict"), "n_predict", "max tokens per response, -1 = no cap",
      t.n_predict, -1, "LLAMA_ARG_N_PREDICT", metavar="N"),
    F(("-s", "--seed"), "seed", "RNG seed, -1 = random", t.seed, -1, metavar="SEED"),
    F(("-t", "--threads"), "threads", "CPU threads for generation, -1 = auto", t.threads, -1,
      "LLAMA_ARG_THREADS", metavar="N"),
    F(("-tb", "--threads-batch"), "threads_batch", "CPU threads for prompt processing, -1 = auto",
      t.threads, -1, metavar="N", shown_default="same as --threads"),
    F(("-b", "--batch-size"), "batch_size", "logical batch size", t.positive_int, 2048,
      "LLAMA_ARG_BATCH", metavar="N"),
    F(("-ub", "--ubatch-size"), "ubatch_size", "physical batch size", t.positive_int, 512,
      "LLAMA_ARG_UBATCH", metavar="N"),
    F(("-fa", "--flash-attn"), "flash_attn", "flash attention: on, off or auto", t.flash_attn,
      t.FlashAttn.AUTO, "LLAMA_ARG_FLASH_ATTN", metavar="on|off|auto", shown_default="auto (= on)"),
    F(("-ngl", "--gpu-layers", "--n-gpu-layers"), "gpu_layers", "layers on the GPU: N, all or auto",
      t.gpu_layers, -1, "LLAMA_ARG_N_GPU_LAYERS", metavar="N", shown_default="all"),
    F(("--host",), "host", "address(es) to listen on, comma-separated", host_list, "127.0.0.1",
      "LLAMA_ARG_HOST", metavar="HOST"),
    F(("--port",), "port", "port to listen on", t.port, 8080, "LLAMA_ARG_PORT", metavar="PORT"),
    F(("-np", "--parallel"), "parallel",
      "lanes (1-4): concurrent generations, each its own context and KVMem window",
      parallel_slots, 1, "LLAMA_ARG_N_PARALLEL", metavar="N"),
    F(("--slots",), "slots", "expose the /slots monitoring endpoint", None, True,
      "LLAMA_ARG_ENDPOINT_SLOTS", negative=("--no-slots",)),
    F(("--reasoning-format",), "reasoning_format",
      "where thinking goes: none (in content) or auto/deepseek (reasoning_content)",
      reasoning_format, "auto", "LLAMA_ARG_REASONING_FORMAT",
      metavar="FORMAT"),
    F(("-v", "--verbose", "--log-verbose"), "verbose", "log everything (same as -lv 5)", None,
      False),
    F(("--queue-size",), "queue_size", "requests that may wait for the slot before 503",
      t.int_in_range(0, 4096), 16, metavar="N"),
    F(("-mm", "--mmproj"), "mmproj", "multimodal projector GGUF", t.non_empty, None,
      "LLAMA_ARG_MMPROJ", metavar="FNAME", shown_default="none"),
    F(("--mmproj-offload",), "mmproj_offload", "offload the projector to the GPU", None, True,
      "LLAMA_ARG_MMPROJ_OFFLOAD", negative=("--no-mmproj-offload",)),
    F(("--image-max-tokens",), "image_max_tokens", "max tokens per image", t.positive_int, None,
      "LLAMA_ARG_IMAGE_MAX_TOKENS", metavar="N", shown_default="the projector's"),
    F(("--chat-template",), "chat_template", "Jinja chat template (inline source or 'chatml')",
      t.non_empty, None, "LLAMA_ARG_CHAT_TEMPLATE", metavar="JINJA", shown_default="the GGUF's"),
    F(("--chat-template-file",), "chat_template_file", "file holding a Jinja chat template",
      t.non_empty, None, "LLAMA_ARG_CHAT_TEMPLATE_FILE", metavar="FNAME", shown_default="none"),
    F(("--chat-template-kwargs",), "chat_template_kwargs", "JSON object of extra template variables",
      t.json_object, None, "LLAMA_ARG_CHAT_TEMPLATE_KWARGS", metavar="JSON", shown_default="{}"),
    F(("--jinja",), "jinja", "use Jinja templates (always on)", None, True, "LLAMA_ARG_JINJA",
      negative=("--no-jinja",)),
    F(("--reasoning-effort",), "reasoning_effort", "default reasoning effort given to the template",
      t.effort_level, "default", "LLAMA_ARG_REASONING_EFFORT", metavar="LEVEL"),
    F(("--enable-thinking",), "enable_thinking", "set enable_thinking=true for the template", None,
      None, shown_default="the template's"),
    F(("-rea", "--reasoning"), "reasoning", "thinking: on, off or auto", t.reasoning_switch, None,
      "LLAMA_ARG_REASONING", metavar="on|off|auto", shown_default="auto"),
    F(("--reasoning-budget",), "reasoning_budget",
      "thinking token budget: -1 unlimited, 0 none, N tokens", t.reasoning_budget, -1,
      "LLAMA_ARG_THINK_BUDGET", metavar="N"),
    F(("--reasoning-budget-message",), "reasoning_budget_message",
      "text inserted before the end-of-thinking tag when the budget runs out", str, "",
      "LLAMA_ARG_THINK_BUDGET_MESSAGE", metavar="TEXT", shown_default="none"),
    F(("--api-key",), "api_key", "API key(s), comma-separated (CSV quoting); repeatable", str, None,
      "LLAMA_API_KEY", append=True, metavar="KEY", shown_default="none: no authentication"),
    F(("--api-key-file",), "api_key_file", "file with one API key per line; repeatable", str, None,
      "LLAMA_ARG_API_KEY_FILE", append=True, metavar="FNAME", shown_default="none"),
    F(("-lv", "--verbosity", "--log-verbosity"), "verbosity",
      "log level: 0 silent, 1 errors, 2 warnings, 3 info, 4 trace, 5 debug", t.verbosity, 3,
      "LLAMA_ARG_LOG_VERBOSITY", metavar="N"),
    F(("-dev", "--device"), "device", "the one device to use (e.g. CUDA0, none)", t.device_list, (),
      "LLAMA_ARG_DEVICE", metavar="DEV", shown_default="automatic"),
    F(("-sm", "--split-mode"), "split_mode", "none or layer (one GPU only)", t.split_mode,
      t.SplitMode.LAYER, "LLAMA_ARG_SPLIT_MODE", metavar="MODE"),
    F(("-mg", "--main-gpu"), "main_gpu", "index of the GPU to use", t.int_in_range(0), 0,
      "LLAMA_ARG_MAIN_GPU", metavar="INDEX"),
    F(("-ts", "--tensor-split"), "tensor_split", "one proportion (one GPU only)", t.tensor_split, (),
      "LLAMA_ARG_TENSOR_SPLIT", metavar="N0", shown_default="none"),
    F(("--ui", "--webui"), "ui", "serve the browser chat page at /", None, True, "LLAMA_ARG_UI",
      negative=("--no-ui", "--no-webui")),
    F(("--ui-dir", "--path"), "ui_dir", "directory of the chat page to serve", t.non_empty, None,
      "LLAMA_ARG_STATIC_PATH", metavar="PATH", shown_default="the packaged page"),
    F(("--metrics",), "metrics", "enable the Prometheus /metrics endpoint", None, False,
      "LLAMA_ARG_ENDPOINT_METRICS"),
    F(("--temp", "--temperature"), "temperature", "default temperature, 0 = greedy",
      t.float_in_range(0.0), 0.8, "LLAMA_ARG_TEMPERATURE", metavar="T"),
    F(("--top-k",), "top_k", "default top-k, 0 = off", t.int_in_range(0), 40, "LLAMA_ARG_TOP_K",
      metavar="N"),
    F(("--top-p",), "top_p", "default top-p", t.float_in_range(0.0, 1.0), 0.95, "LLAMA_ARG_TOP_P",
      metavar="P"),
    F(("--min-p",), "min_p", "default min-p", t.float_in_range(0.0, 1.0), 0.05, "LLAMA_ARG_MIN_P",
      metavar="P"),
    F(("--repeat-penalty",), "repeat_penalty", "default repeat penalty, 1 = off",
      t.float_in_range(0.0), 1.0, "LLAMA_ARG_REPEAT_PENALTY", metavar="X"),
    F(("--repeat-last-n",), "repeat_last_n", "tokens the penalties look back over",
      t.int_in_range(-1), 64, metavar="N"),
    F(("--presence-penalty",), "presence_penalty", "default presence penalty",
      t.float_in_range(-2.0, 2.0), 0.0, "LLAMA_ARG_PRESENCE_PENALTY", metavar="X"),
    F(("--frequency-penalty",), "frequency_penalty", "default frequency penalty",
      t.float_in_range(-2.0, 2.0), 0.0, "LLAMA_ARG_FREQUENCY_PENALTY", metavar="X"),
    # resource bounds and browser safety (kvmem.server.limits)
    F(("--max-body-size",), "max_body_size", "largest request body (bytes, or K/M/G)",
      lim.byte_size, lim.DEFAULT_MAX_BODY_BYTES, metavar="SIZE", shown_default="32M"),
    F(("--header-timeout",), "header_timeout", "seconds a connection may take to send its headers",
      lim.seconds, lim.DEFAULT_HEADER_TIMEOUT_S, metavar="S"),
    F(("--body-timeout",), "body_timeout", "seconds a request may take to send its body",
      lim.seconds, lim.DEFAULT_BODY_TIMEOUT_S, metavar="S"),
    F(("--keep-alive-timeout",), "keep_alive_timeout", "seconds an idle keep-alive connection stays",
      lim.seconds, lim.DEFAULT_KEEP_ALIVE_TIMEOUT_S, metavar="S"),
    F(("--max-connections",), "max_connections", "open connections before new ones are closed",
      t.int_in_range(2, 1_000_000), lim.DEFAULT_MAX_CONNECTIONS, metavar="N"),
    F(("--cors-origins",), "cors_origins", "origins allowed cross-origin: a comma list, or '*'",
      lim.cors_origins, (), metavar="LIST", shown_default="none: same-origin only"),
)
# fmt: on


# The shared -ctk/-ctv flags (kvmem_flags) have llama.cpp variables too.
def _kv_type_name(text: str) -> str:
    return parse_kv_type(text, "cache type").label


EXTRA_ENV = (
    EnvBinding("LLAMA_ARG_CACHE_TYPE_K", "cache_type_k", _kv_type_name),
    EnvBinding("LLAMA_ARG_CACHE_TYPE_V", "cache_type_v", _kv_type_name),
)


class ServerArgumentParser(argparse.ArgumentParser):
    """argparse that raises ConfigError instead of exiting, so main() reports it once."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError("", message)


def env_bindings() -> list[EnvBinding]:
    bindings = [
        EnvBinding(s.env, s.dest, s.parse, negatable=bool(s.negative))
        for s in SERVER_FLAGS
        if s.env
    ]
    return bindings + list(EXTRA_ENV)


def _help(spec: FlagSpec) -> str:
    shown = spec.shown_default if spec.shown_default is not None else _show(spec.default)
    env = f"; env: {spec.env}" if spec.env else ""
    return f"{spec.help} (default: {shown}{env})".replace("%", "%%")


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "enabled" if value else "disabled"
    if hasattr(value, "value"):
        return str(value.value)
    return str(value)


def build_server_parser() -> ServerArgumentParser:
    p = ServerArgumentParser(
        prog="kvmem-server",
        add_help=False,
        description="OpenAI-compatible chat server with KVMem tiered KV memory, on llama.cpp.",
    )
    p.add_argument(
        "-h", "--help", "--usage", action="help", help="show every flag with its default and exit"
    )
    p.add_argument("--version", action="version", version=f"kvmem-server {__version__}")
    group = p.add_argument_group("server (llama-server compatible)")
    for spec in SERVER_FLAGS:
        if spec.parse is None:
            group.add_argument(
                *spec.flags,
                dest=spec.dest,
                action="store_const",
                const=True,
                default=argparse.SUPPRESS,
                help=_help(spec),
            )
            if spec.negative:
                group.add_argument(
                    *spec.negative,
                    dest=spec.dest,
                    action="store_const",
                    const=False,
                    default=argparse.SUPPRESS,
                    help=f"disable {spec.flags[-1]}",
                )
        else:
            group.add_argument(
                *spec.flags,
                dest=spec.dest,
                type=spec.parse,
                metavar=spec.metavar,
                action="append" if spec.append else "store",
                default=argparse.SUPPRESS,
                help=_help(spec),
            )
    add_kv_cache_arguments(p)
    add_kvmem_arguments(p)
    add_compat_arguments(p)
    return p


@dataclass(slots=True)
class ParsedArgs:
    """Flag values after CLI > env > default, with where each came from."""

    values: dict[str, Any]
    sources: dict[str, str]
    namespace: argparse.Namespace  # includes the shared kvmem/KV-cache flags
    warnings: list[str] = field(default_factory=list)
    env_api_keys: list[tuple[str, str]] = field(default_factory=list)  # (value, source)
    env_api_key_files: list[tuple[str, str]] = field(default_factory=list)


def parse_server_argv(argv: Sequence[str], environ: Mapping[str, str]) -> ParsedArgs:
    """Parse the environment (validated first) and the command line."""
    bindings = env_bindings()
    warnings = check_env_names(environ, supported_names(bindings))
    env_values = {b.dest: v for b in bindings if (v := read_env_value(b, environ)) is not MISSING}
    ns = build_server_parser().parse_args(list(argv))
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for spec in SERVER_FLAGS:
        if spec.append:
            continue
        if hasattr(ns, spec.dest):
            values[spec.dest], sources[spec.dest] = getattr(ns, spec.dest), "cli"
        elif spec.dest in env_values:
            values[spec.dest], sources[spec.dest] = env_values[spec.dest], "env"
        else:
            values[spec.dest], sources[spec.dest] = spec.default, "default"
    for binding in EXTRA_ENV:
        if getattr(ns, binding.dest) is None and binding.dest in env_values:
            setattr(ns, binding.dest, env_values[binding.dest])
            sources[binding.dest] = "env"
    parsed = ParsedArgs(values, sources, ns, warnings)
    if "api_key" in env_values:
        parsed.env_api_keys.append((env_values["api_key"], "LLAMA_API_KEY"))
    if "api_key_file" in env_values:
        parsed.env_api_key_files.append((env_values["api_key_file"], "LLAMA_ARG_API_KEY_FILE"))
    values["api_key"] = [(v, "--api-key") for v in getattr(ns, "api_key", [])]
    values["api_key_file"] = [(v, "--api-key-file") for v in getattr(ns, "api_key_file", [])]
    return parsed
