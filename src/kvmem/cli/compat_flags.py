"""llama-server flags that a stock launch line passes and KVMem handles specially.

Two tables:
- `NOOP_SWITCHES`: switches accepted as documented no-ops, because KVMem's single
  session makes them meaningless (`--cont-batching`, `--context-shift`, `--kv-unified`,
  `--swa-full`, ...). Each has the reason shown in `--help`.
- `REJECTED_FLAGS`: llama-server flags for features kvmem-server does not offer. They
  are parsed (so the message is ours, not argparse's "unrecognized arguments") and fail
  before the model loads with a message saying why.

`--slots`/`--no-slots`, `--reasoning-format` and `-v/--verbose` have meanings and live in
`server_args.SERVER_FLAGS`.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from kvmem.errors import ConfigError


@dataclass(frozen=True, slots=True)
class CompatFlag:
    flags: tuple[str, ...]
    reason: str
    takes_value: bool = False


C = CompatFlag
# fmt: off
NOOP_SWITCHES: tuple[CompatFlag, ...] = (
    C(("-cb", "--cont-batching", "-nocb", "--no-cont-batching"),
      "no-op: one KVMem session serves one request at a time"),
    C(("--context-shift", "--no-context-shift"),
      "no-op: KVMem keeps the whole history and selects what fits instead of shifting"),
    C(("-kvu", "--kv-unified", "-no-kvu", "--no-kv-unified"),
      "no-op: the KV cache is always unified (KVMem needs it)"),
    C(("--swa-full",), "no-op: KVMem manages the attention window itself"),
    C(("--cache-prompt", "--no-cache-prompt"),
      "no-op: the session always reuses the matching prefix"),
    C(("--warmup", "--no-warmup"), "no-op: the model is not warmed up"),
    C(("--mlock", "--no-mmap", "--mmap"), "no-op: the model is mapped as llama.cpp decides"),
)

REJECTED_FLAGS: tuple[CompatFlag, ...] = (
    C(("-hf", "-hfr", "--hf-repo", "-hff", "--hf-file", "-mu", "--model-url", "--offline",
       "-hft", "--hf-token"),
      "kvmem-server never downloads models: pass a local file with -m", True),
    C(("--embedding", "--embeddings", "--reranking", "--rerank"),
      "embeddings and reranking are not offered (kvmem-server serves generation only)"),
    C(("--pooling",), "embeddings are not offered, so there is no pooling", True),
    C(("--lora", "--lora-scaled", "--lora-init-without-apply"),
      "LoRA adapters are not supported", True),
    C(("-md", "--model-draft", "--draft", "--draft-max", "--draft-min", "--spec-draft-n-min"),
      "draft models are not supported: use --spec-type ngram-simple", True),
    C(("-gan", "--grp-attn-n", "-gaw", "--grp-attn-w"),
      "group attention (self-extend) is not supported: KVMem extends the context instead", True),
    C(("--models-dir", "--models-max", "--models-preset"),
      "router mode is not supported: one kvmem-server serves one model", True),
    C(("--no-models-autoload",), "router mode is not supported: one kvmem-server serves one model"),
    C(("--tags",), "model tags are not supported", True),
    C(("--slot-save-path",),
      "saving and restoring slots is not supported yet (the KVMem session lives in memory)", True),
    C(("--sleep-idle-seconds",), "idle sleep is not supported", True),
    C(("--cache-ram",), "the host prompt cache is KVMem's; size it with --kvmem-* flags", True),
    C(("--mmproj-url",), "projectors are not downloaded: pass a local --mmproj file", True),
    C(("--tools", "--tools-runtime", "--mcp-servers-config", "--mcp-servers-json"),
      "built-in tools and MCP servers are not offered: the client executes tools", True),
    C(("--ui-mcp-proxy",), "the MCP proxy is not offered"),
    C(("--backend_sampling", "--backend-sampling"), "backend sampling is not supported"),
    C(("--rope-scaling", "--rope-scale", "--rope-freq-base", "--rope-freq-scale", "--yarn-orig-ctx"),
      "RoPE overrides are not supported: KVMem places positions itself", True),
    C(("--ssl-key-file", "--ssl-cert-file"),
      "TLS is not supported: put a reverse proxy in front of kvmem-server", True),
)
# fmt: on

_REJECT_DEST = "compat_rejected"


class _Reject(argparse.Action):
    def __init__(self, option_strings: list[str], dest: str, reason: str, **kwargs: object):
        self.reason = reason
        super().__init__(option_strings, dest, **kwargs)  # type: ignore[arg-type]

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[no-untyped-def]
        raise ConfigError(option_string or self.option_strings[0], self.reason)


def add_compat_arguments(parser: argparse.ArgumentParser) -> None:
    noop = parser.add_argument_group("llama-server flags accepted as no-ops")
    for spec in NOOP_SWITCHES:
        noop.add_argument(
            *spec.flags,
            dest="compat_noop",
            action="append_const",
            const=spec.flags[0],
            default=argparse.SUPPRESS,
            help=spec.reason,
        )
    rejected = parser.add_argument_group("llama-server flags that are rejected")
    for spec in REJECTED_FLAGS:
        rejected.add_argument(
            *spec.flags,
            dest=_REJECT_DEST,
            action=_Reject,
            reason=spec.reason,
            nargs=1 if spec.takes_value else 0,
            metavar="X" if spec.takes_value else None,
            default=argparse.SUPPRESS,
            help=f"rejected: {spec.reason}",
        )


REASONING_FORMATS = ("none", "auto", "deepseek")


def reasoning_format(text: str) -> str:
    """--reasoning-format: none (thinking stays in content, tags included) or auto/deepseek
    (thinking goes to reasoning_content). deepseek-legacy (both at once) is not offered."""
    value = text.strip().lower()
    if value == "deepseek-legacy":
        raise argparse.ArgumentTypeError(
            "'deepseek-legacy' (thinking in both content and reasoning_content) is not "
            "supported: use deepseek or none"
        )
    if value not in REASONING_FORMATS:
        raise argparse.ArgumentTypeError(
            f"invalid reasoning format {text!r}: use one of {', '.join(REASONING_FORMATS)}"
        )
    return value


def host_list(text: str) -> str:
    """--host: one address or a comma-separated list (each is bound on --port)."""
    parts = [p.strip() for p in text.split(",")]
    if not all(parts):
        raise argparse.ArgumentTypeError(f"invalid host list {text!r}: an address is empty")
    return ",".join(parts)


def parallel_slots(text: str) -> int:
    from kvmem.cli.kvmem_flags import strict_int

    value = strict_int(text)
    if value < 1 and value != -1:
        raise argparse.ArgumentTypeError(f"{value} is out of range: must be >= 1 (or -1 = auto)")
    return value
