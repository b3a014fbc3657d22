"""kvmem-server's flags that feed a derived setting rather than a field of their own: the
model and its placement (-> `EngineSettings`), the chat template and thinking, the vision
projector, logging switches and API keys. Each record's fields declare their flags
(`kvmem.settings.setting`); kvmem.cli.server_config builds the records from the parsed
values (`from_values`) and resolves them into `ServerSettings`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvmem.settings import Group, Program, setting
from kvmem.settings import values as t

LOAD_MODE_NAMES = ("auto", "none", "mmap", "mlock", "mmap+mlock", "dio")  # llama.cpp's -lm
_MODEL = {"group": Group.MODEL}
_GPU = {"group": Group.GPU}
_TEMPLATE = {"group": Group.TEMPLATE}
_VISION = {"group": Group.VISION}


@dataclass(frozen=True, slots=True)
class ModelFlags:
    """What to load and how (model & context, GPU placement)."""

    model: str | None = setting(
        None, "-m", "--model", help="GGUF model file or a model name (qwen-0.5b)",
        parse=t.non_empty, env="LLAMA_ARG_MODEL", metavar="FNAME", programs=Program.BOTH,
        shown="the embedded SmolLM2-135M-Instruct", **_MODEL,
    )  # fmt: skip
    ctx_size: int | None = setting(
        None, "-c", "--ctx-size", help="logical context size in tokens (positive)",
        parse=t.ctx_size, env="LLAMA_ARG_CTX_SIZE", metavar="N",
        shown="the model's training context", **_MODEL,
    )  # fmt: skip
    threads: int = setting(
        -1, "-t", "--threads", help="CPU threads for generation (1-512), -1 = auto",
        parse=t.threads, env="LLAMA_ARG_THREADS", metavar="N", **_MODEL,
    )  # fmt: skip
    threads_batch: int = setting(
        -1, "-tb", "--threads-batch",
        help="CPU threads for prompt processing (1-512), -1 = auto", parse=t.threads,
        metavar="N", shown="same as --threads", **_MODEL,
    )  # fmt: skip
    batch_size: int = setting(
        2048, "-b", "--batch-size", help="logical batch size", parse=t.positive_int,
        env="LLAMA_ARG_BATCH", metavar="N", **_MODEL,
    )  # fmt: skip
    ubatch_size: int = setting(
        512, "-ub", "--ubatch-size", help="physical batch size (clamped to -b)",
        parse=t.positive_int, env="LLAMA_ARG_UBATCH", metavar="N", **_MODEL,
    )  # fmt: skip
    flash_attn: t.FlashAttn = setting(
        t.FlashAttn.AUTO, "-fa", "--flash-attn", help="flash attention: on, off or auto",
        parse=t.flash_attn, env="LLAMA_ARG_FLASH_ATTN", metavar="on|off|auto",
        shown="auto (= on)", **_MODEL,
    )  # fmt: skip
    gpu_layers: int = setting(
        -1, "-ngl", "--gpu-layers", "--n-gpu-layers", help="layers on the GPU: N, all or auto",
        parse=t.gpu_layers, env="LLAMA_ARG_N_GPU_LAYERS", metavar="N", shown="all", **_MODEL,
    )  # fmt: skip
    load_mode: str = setting(
        "auto", "-lm", "--load-mode",
        help="how the weights load: auto (mmap unless a device cannot), none (read), mmap, "
        "mlock (read and locked in RAM), mmap+mlock or dio (direct I/O)", parse=str,
        env="LLAMA_ARG_LOAD_MODE", metavar="MODE", choices=LOAD_MODE_NAMES, **_MODEL,
    )  # fmt: skip
    mlock: bool = setting(
        False, "--mlock",
        help="keep the weights in RAM, never swapped out (= -lm mmap+mlock, or mlock with "
        "--no-mmap)", env="LLAMA_ARG_MLOCK", **_MODEL,
    )  # fmt: skip
    mmap: bool | None = setting(
        None, "--mmap", help="map the model file (= -lm mmap); --no-mmap reads it (= -lm none)",
        env="LLAMA_ARG_MMAP", negative=("--no-mmap",), shown="auto", **_MODEL,
    )  # fmt: skip
    warmup: bool = setting(
        True, "--warmup",
        help="warm the model up at load with one scratch decode (BOS and EOS, then the "
        "memory cleared), before any stored session is restored; each lane's context once",
        negative=("--no-warmup",), shown="enabled", **_MODEL,
    )  # fmt: skip
    device: tuple[str, ...] = setting(
        (), "-dev", "--device",
        help="the one device: none (CPU) or NAME<i>, e.g. CUDA0 (= -sm none -mg i)",
        parse=t.device_list, env="LLAMA_ARG_DEVICE", metavar="DEV", shown="automatic", **_GPU,
    )  # fmt: skip
    split_mode: t.SplitMode = setting(
        t.SplitMode.LAYER, "-sm", "--split-mode",
        help="llama.cpp split mode: none or layer (one GPU only)", parse=t.split_mode,
        env="LLAMA_ARG_SPLIT_MODE", metavar="MODE", **_GPU,
    )  # fmt: skip
    main_gpu: int = setting(
        0, "-mg", "--main-gpu", help="llama.cpp main GPU: the GPU used with -sm none",
        parse=t.int_in_range(0), env="LLAMA_ARG_MAIN_GPU", metavar="INDEX", **_GPU,
    )  # fmt: skip
    tensor_split: tuple[float, ...] = setting(
        (), "-ts", "--tensor-split",
        help="llama.cpp tensor split: proportions, at most one non-zero (one GPU only)",
        parse=t.tensor_split, env="LLAMA_ARG_TENSOR_SPLIT", metavar="N0", shown="none", **_GPU,
    )  # fmt: skip
    rpc: tuple[Any, ...] = setting(
        (), "--rpc",
        help="RPC workers (kvmem-rpc-worker) whose devices join the layer split, before the "
        "local GPUs; no authentication: trusted networks only",
        parse=t.rpc_workers, env="LLAMA_ARG_RPC", metavar="HOST:PORT,...", shown="none",
        programs=Program.BOTH, **_GPU,
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class TemplateFlags:
    """The chat template and the thinking defaults given to it."""

    chat_template: str | None = setting(
        None, "--chat-template", help="Jinja chat template (inline source or 'chatml')",
        parse=t.non_empty, env="LLAMA_ARG_CHAT_TEMPLATE", metavar="JINJA",
        shown="the GGUF's", **_TEMPLATE,
    )  # fmt: skip
    chat_template_file: str | None = setting(
        None, "--chat-template-file", help="file holding a Jinja chat template",
        parse=t.non_empty, env="LLAMA_ARG_CHAT_TEMPLATE_FILE", metavar="FNAME", shown="none",
        **_TEMPLATE,
    )  # fmt: skip
    chat_template_kwargs: dict[str, Any] | None = setting(
        None, "--chat-template-kwargs", help="JSON object of extra template variables",
        parse=t.json_object, env="LLAMA_ARG_CHAT_TEMPLATE_KWARGS", metavar="JSON", shown="{}",
        **_TEMPLATE,
    )  # fmt: skip
    jinja: bool = setting(
        True, "--jinja", help="use Jinja templates (always on; --no-jinja warns)",
        env="LLAMA_ARG_JINJA", negative=("--no-jinja",), **_TEMPLATE,
    )  # fmt: skip
    reasoning_effort: str = setting(
        "default", "--reasoning-effort", help="default reasoning effort given to the template",
        parse=t.effort_level, env="LLAMA_ARG_REASONING_EFFORT", metavar="LEVEL", **_TEMPLATE,
    )  # fmt: skip
    enable_thinking: bool | None = setting(
        None, "--enable-thinking", help="set enable_thinking=true for the template",
        shown="the template's", **_TEMPLATE,
    )  # fmt: skip
    reasoning: bool | None = setting(
        None, "-rea", "--reasoning", help="thinking: on, off or auto", parse=t.reasoning_switch,
        env="LLAMA_ARG_REASONING", metavar="on|off|auto", shown="auto", **_TEMPLATE,
    )  # fmt: skip
    reasoning_budget: int = setting(
        -1, "--reasoning-budget", help="thinking token budget: -1 unlimited, 0 none, N tokens",
        parse=t.reasoning_budget, env="LLAMA_ARG_THINK_BUDGET", metavar="N", **_TEMPLATE,
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class VisionFlags:
    """The vision projector (kvmem.cli.vision_config checks them into `VisionSettings`)."""

    mmproj: str | None = setting(
        None, "-mm", "--mmproj", help="multimodal projector GGUF", parse=t.non_empty,
        env="LLAMA_ARG_MMPROJ", metavar="FNAME", shown="none", **_VISION,
    )  # fmt: skip
    mmproj_offload: bool = setting(
        True, "--mmproj-offload", help="offload the projector to the GPU",
        env="LLAMA_ARG_MMPROJ_OFFLOAD", negative=("--no-mmproj-offload",), **_VISION,
    )  # fmt: skip
    image_max_tokens: int | None = setting(
        None, "--image-max-tokens", help="max tokens per image", parse=t.positive_int,
        env="LLAMA_ARG_IMAGE_MAX_TOKENS", metavar="N", shown="the projector's", **_VISION,
    )  # fmt: skip
    image_min_tokens: int | None = setting(
        None, "--image-min-tokens", help="min tokens per image", parse=t.positive_int,
        env="LLAMA_ARG_IMAGE_MIN_TOKENS", metavar="N", shown="the projector's", **_VISION,
    )  # fmt: skip
    media_path: str | None = setting(
        None, "--media-path", help="directory file:// image URLs may be read from",
        parse=t.non_empty, env="LLAMA_ARG_MEDIA_PATH", metavar="DIR", shown="none", **_VISION,
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class LogFlags:
    """The switches that resolve `ServerSettings.verbosity` with -lv."""

    verbose: bool = setting(
        False, "-v", "--verbose", "--log-verbose",
        help="log everything (-lv 5 unless -lv is given) and add __verbose to chat responses",
        group=Group.LOG,
    )  # fmt: skip
    log_disable: bool = setting(
        False, "--log-disable", help="no log at all (as -lv 0)", group=Group.LOG
    )


@dataclass(frozen=True, slots=True)
class AuthFlags:
    """API keys, collected with their sources by kvmem.cli.api_keys (repeatable flags)."""

    api_key: tuple[str, ...] = setting(
        (), "--api-key", help="API key(s), comma-separated (CSV quoting); repeatable", parse=str,
        flag_default=None, env="LLAMA_API_KEY", append=True, metavar="KEY",
        shown="none: no authentication", group=Group.AUTH,
    )  # fmt: skip
    api_key_file: tuple[str, ...] = setting(
        (), "--api-key-file", help="file with one API key per line; repeatable", parse=str,
        flag_default=None, env="LLAMA_ARG_API_KEY_FILE", append=True, metavar="FNAME",
        shown="none", group=Group.AUTH,
    )  # fmt: skip
