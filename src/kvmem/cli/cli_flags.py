"""kvmem-cli's own flags, declared on `CliFlags`' fields.

Some names are shared with kvmem-server (`-c`, `-n`, `--temp`, `-t`, ...) but kvmem-cli
parses them loosely and checks them after parsing (`chat_cli._check`), with its own
messages; these fields carry `programs=CLI` (the server's are on its records). `-m`, the
KV cache types, `--kvmem-*` and `--spec-*` are shared with the server (programs=BOTH).
kvmem-cli reads no environment variables besides KVMEM_TRACE.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvmem.settings import Group, Program, setting
from kvmem.settings.values import int32, strict_float


def _c(
    default: Any,
    *names: str,
    help: str,
    parse: Callable[[str], Any] | None = None,
    group: Group = Group.CLI,
    **kw: Any,
) -> Any:
    return setting(default, *names, help=help, parse=parse, group=group, programs=Program.CLI, **kw)


_MODEL = Group.MODEL
_SAMPLING = Group.SAMPLING


@dataclass(frozen=True, slots=True)
class CliFlags:
    """What kvmem-cli's own flags hold as parsed (checked by chat_cli._check)."""

    ctx_size: int = _c(
        0, "-c", "--ctx-size", help="logical context in tokens", parse=int32, group=_MODEL,
        shown="the model's",
    )  # fmt: skip
    prompt: str | None = _c(None, "-p", "--prompt", help="prompt text", parse=str)
    file: str | None = _c(None, "-f", "--file", help="read the prompt from a file", parse=str)
    n_predict: int = _c(
        1024, "-n", "--n-predict", "--predict", help="most tokens per reply (a reply cut there "
        "is marked), -1 = until end of generation or the context", parse=int32, group=_SAMPLING,
    )  # fmt: skip
    temp: float = _c(
        0.8, "--temp", help="temperature, 0 = greedy", parse=strict_float, group=_SAMPLING
    )
    top_k: int = _c(40, "--top-k", help="top-k, 0 = off", parse=int32, group=_SAMPLING)
    top_p: float = _c(0.95, "--top-p", help="top-p", parse=strict_float, group=_SAMPLING)
    min_p: float = _c(0.05, "--min-p", help="min-p", parse=strict_float, group=_SAMPLING)
    repeat_penalty: float = _c(
        1.0, "--repeat-penalty", help="repeat penalty, 1 = off", parse=strict_float,
        group=_SAMPLING,
    )  # fmt: skip
    seed: int = _c(-1, "-s", "--seed", help="RNG seed, -1 = random", parse=int32, group=_SAMPLING)
    ignore_eos: bool = _c(
        False, "--ignore-eos", help="keep generating past end-of-generation tokens",
        group=_SAMPLING,
    )  # fmt: skip
    raw: bool = _c(False, "--raw", help="use the prompt as is, without the chat template")
    system_prompt: str | None = _c(
        None, "-sys", "--system-prompt", help="system message for chat mode", parse=str
    )
    interactive: bool = _c(False, "-i", "--interactive", help="multi-turn chat on stdin")
    threads: int | None = _c(
        None, "-t", "--threads", help="CPU threads for generation", parse=int32, group=_MODEL,
        shown="llama.cpp's",
    )  # fmt: skip
    threads_batch: int | None = _c(
        None, "-tb", "--threads-batch", help="CPU threads for prompt processing", parse=int32,
        group=_MODEL, shown="llama.cpp's",
    )  # fmt: skip
    batch_size: int = _c(
        2048, "-b", "--batch-size", help="logical batch size", parse=int32, group=_MODEL
    )
    ubatch_size: int = _c(
        512, "-ub", "--ubatch-size", help="physical batch size", parse=int32, group=_MODEL
    )
    gpu_layers: str = _c(
        "all", "-ngl", "--gpu-layers", "--n-gpu-layers", help="layers on the GPU: N, all or auto",
        parse=str, group=_MODEL,
    )  # fmt: skip
    flash_attn: str = _c(
        "on", "-fa", "--flash-attn", help="flash attention", parse=str,
        choices=("on", "off", "auto"), group=_MODEL,
    )  # fmt: skip
    verbose: bool = _c(False, "-v", "--verbose", help="show llama.cpp's log")
    progress_bar: bool | None = _c(
        None, "--progress-bar", help="a progress bar on stderr while a long prompt is processed; "
        "--no-progress-bar: none", negative=("--no-progress-bar",),
        shown="when stderr is a terminal",
    )  # fmt: skip
