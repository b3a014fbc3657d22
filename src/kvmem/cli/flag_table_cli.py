"""The flag table's rows that only kvmem-cli reads.

Some names are shared with kvmem-server (`-c`, `-n`, `--temp`, `-t`, ...) but kvmem-cli
parses them loosely and checks them after parsing (`chat_cli._check`), with its own
messages; those rows carry `programs=CLI` and the server's rows `programs=SERVER`.
kvmem-cli reads no environment variables besides KVMEM_TRACE.
"""

from __future__ import annotations

from kvmem.cli.arg_types import int32, strict_float

from .flag_spec import Flag, Group, Program


def _c(
    flags: tuple[str, ...],
    dest: str,
    help_text: str,
    parse: object = None,
    default: object = None,
    group: Group = Group.CLI,
    **kw: object,
) -> Flag:
    return Flag(flags, dest, help_text, parse, default, programs=Program.CLI, group=group, **kw)  # type: ignore[arg-type]


# fmt: off
CLI_TABLE: tuple[Flag, ...] = (
    _c(("-c", "--ctx-size"), "ctx_size", "logical context in tokens", int32, 0,
       shown_default="the model's", group=Group.MODEL),
    _c(("-p", "--prompt"), "prompt", "prompt text", str),
    _c(("-f", "--file"), "file", "read the prompt from a file", str),
    _c(("-n", "--n-predict", "--predict"), "n_predict",
       "most tokens per reply (a reply cut there is marked), -1 = until end of generation "
       "or the context", int32, 1024, group=Group.SAMPLING),
    _c(("--temp",), "temp", "temperature, 0 = greedy", strict_float, 0.8, group=Group.SAMPLING),
    _c(("--top-k",), "top_k", "top-k, 0 = off", int32, 40, group=Group.SAMPLING),
    _c(("--top-p",), "top_p", "top-p", strict_float, 0.95, group=Group.SAMPLING),
    _c(("--min-p",), "min_p", "min-p", strict_float, 0.05, group=Group.SAMPLING),
    _c(("--repeat-penalty",), "repeat_penalty", "repeat penalty, 1 = off", strict_float, 1.0, group=Group.SAMPLING),
    _c(("-s", "--seed"), "seed", "RNG seed, -1 = random", int32, -1, group=Group.SAMPLING),
    _c(("--ignore-eos",), "ignore_eos", "keep generating past end-of-generation tokens", None,
       False, group=Group.SAMPLING),
    _c(("--raw",), "raw", "use the prompt as is, without the chat template", None, False),
    _c(("-sys", "--system-prompt"), "system_prompt", "system message for chat mode", str),
    _c(("-i", "--interactive"), "interactive", "multi-turn chat on stdin", None, False),
    _c(("-t", "--threads"), "threads", "CPU threads for generation", int32,
       shown_default="llama.cpp's", group=Group.MODEL),
    _c(("-tb", "--threads-batch"), "threads_batch", "CPU threads for prompt processing",
       int32, shown_default="llama.cpp's", group=Group.MODEL),
    _c(("-b", "--batch-size"), "batch_size", "logical batch size", int32, 2048, group=Group.MODEL),
    _c(("-ub", "--ubatch-size"), "ubatch_size", "physical batch size", int32, 512, group=Group.MODEL),
    _c(("-ngl", "--gpu-layers", "--n-gpu-layers"), "gpu_layers",
       "layers on the GPU: N, all or auto", str, "all", group=Group.MODEL),
    _c(("-fa", "--flash-attn"), "flash_attn", "flash attention", str, "on",
       choices=("on", "off", "auto"), group=Group.MODEL),
    _c(("-v", "--verbose"), "verbose", "show llama.cpp's log", None, False),
    _c(("--progress-bar",), "progress_bar",
       "a progress bar on stderr while a long prompt is processed; --no-progress-bar: none",
       None, None, negative=("--no-progress-bar",), shown_default="when stderr is a terminal"),
)
# fmt: on
