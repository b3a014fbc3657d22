"""Parsed flags -> validated `ServerSettings`, before any weights load.

The flags are declared on the records' fields (kvmem.cli.flag_table lists them); the
records are built from the parsed values with `from_values`, and this module resolves the
ones that combine (load mode, verbosity, timeouts, thinking, the engine's settings).

Checks here: the single slot, multi-GPU options that cannot work, model/projector/
template/UI files, the chat template's syntax, API keys, the KVMem and KV-cache settings.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from kvmem.chat.template import check_template_source, resolve_template_source
from kvmem.chat.thinking import ThinkingDefaults
from kvmem.cli.api_keys import collect_api_keys
from kvmem.cli.fit_flags import FitFlags, GpuProbe, fit_engine
from kvmem.cli.gpu_placement import gpu_placement
from kvmem.cli.kvmem_flags import KVMemFlags, kvmem_config_from_args
from kvmem.cli.limit_flags import ServerLimits
from kvmem.cli.server_args import ParsedArgs, parse_server_argv
from kvmem.cli.server_flags import LogFlags, ModelFlags, TemplateFlags, VisionFlags
from kvmem.cli.server_settings import ServerSettings, Source
from kvmem.cli.spec_flags import spec_config_from_args
from kvmem.cli.vision_config import MEDIA_PATH_WITHOUT_MMPROJ, vision_from_flags
from kvmem.engine_settings import MAX_LANES, EngineSettings, VisionSettings
from kvmem.errors import ConfigError
from kvmem.models import resolve_model_flag
from kvmem.sampling import SamplingParams
from kvmem.settings import from_values
from kvmem.settings.values import FlashAttn, SplitMode

logger = logging.getLogger(__name__)

_GGUF_MAGIC = b"GGUF"


def trace_from_env(environ: Mapping[str, str]) -> bool:
    """KVMEM_TRACE: unset, empty or 0 disables; anything else enables."""
    return environ.get("KVMEM_TRACE", "").strip() not in ("", "0")


def check_gguf_file(path: str, flag: str) -> None:
    p = Path(path)
    if p.is_dir():
        raise ConfigError(flag, f"{path} is a directory: give a GGUF file")
    if not p.is_file():
        raise ConfigError(flag, f"file not found: {path}")
    try:
        with p.open("rb") as handle:
            magic = handle.read(4)
    except OSError as exc:
        raise ConfigError(flag, f"cannot read {path}: {exc.strerror or exc}") from None
    if magic != _GGUF_MAGIC:
        raise ConfigError(flag, f"{path} is not a GGUF file")


# --parallel lanes (engine/lanes.py) ------------------------------------------------------
def _lanes(parallel: int) -> int:
    """--parallel N: 1 to MAX_LANES lanes (-1, llama.cpp's auto: 1)."""
    n = 1 if parallel == -1 else parallel
    if n > MAX_LANES:
        raise ConfigError(
            "--parallel",
            f"{n} lanes asked, at most {MAX_LANES} are supported "
            "(each lane is a context of budget + reserve cells)",
        )
    return n


# end of --parallel ------------------------------------------------------------------------


def _check_gpu_options(m: ModelFlags) -> None:
    if len(m.device) > 1:
        raise ConfigError(
            "--device",
            "multi-GPU operation is not supported: select one device, e.g. --device CUDA0",
        )
    if m.split_mode in (SplitMode.ROW, SplitMode.TENSOR):
        raise ConfigError(
            "--split-mode",
            f"'{m.split_mode.value}' splits across GPUs, which is not supported: "
            "use --split-mode none --main-gpu INDEX or layer on one GPU",
        )
    if sum(1 for x in m.tensor_split if x > 0) > 1 and not m.rpc:  # --rpc: workers' shares first
        raise ConfigError(
            "--tensor-split", "multi-GPU operation is not supported: give at most one GPU a share"
        )


def _template(f: TemplateFlags) -> tuple[str | None, str]:
    inline, path = f.chat_template, f.chat_template_file
    if inline is not None and path is not None:
        raise ConfigError(
            "--chat-template", "give either --chat-template or --chat-template-file, not both"
        )
    if path is not None:
        try:
            source = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError("--chat-template-file", f"cannot read {path}: {exc}") from None
        check_template_source(source, "--chat-template-file")
        return source, path
    if inline is not None:
        source = resolve_template_source(inline)
        check_template_source(source, "--chat-template")
        return source, "--chat-template"
    return None, "gguf"


def _thinking(f: TemplateFlags) -> ThinkingDefaults:
    return ThinkingDefaults(
        template_kwargs=dict(f.chat_template_kwargs or {}),
        reasoning_effort=None if f.reasoning_effort == "default" else f.reasoning_effort,
        enable_thinking=f.reasoning if f.reasoning is not None else f.enable_thinking,
        reasoning_budget=f.reasoning_budget,
    )


def _ui_dir(ui_dir: str | None) -> str | None:
    if ui_dir is None:
        return None
    if not (Path(ui_dir) / "index.html").is_file():
        raise ConfigError("--ui-dir", f"{ui_dir} is not a directory holding index.html")
    return ui_dir


def _slot_dir(path: str | None) -> str | None:
    if path is None:
        return None
    if not Path(path).is_dir():
        raise ConfigError("--slot-save-path", f"{path} is not a directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError("--slot-save-path", f"{path} is not writable")
    return str(Path(path).resolve())


def _load_mode(m: ModelFlags, sources: Mapping[str, str]) -> str:
    """-lm/--load-mode MODE, or llama.cpp's older switches: --no-mmap reads the file,
    --mlock locks the weights in RAM (mapped unless --no-mmap too), --mmap maps it."""
    if sources["load_mode"] != "default":
        return m.load_mode
    if m.mlock:
        return "mlock" if m.mmap is False else "mmap+mlock"
    if m.mmap is None:
        return "auto"
    return "mmap" if m.mmap else "none"


def _verbosity(log: LogFlags, level: int, sources: Mapping[str, str]) -> int:
    """-lv N; --log-disable silences everything; -v alone means -lv 5."""
    if log.log_disable:
        return 0
    if log.verbose and sources["verbosity"] == "default":
        return 5
    return level


def _limits(v: Mapping[str, Any], sources: Mapping[str, str]) -> ServerLimits:
    """The resource bounds; -to/--timeout is the body deadline unless --body-timeout is set."""
    limits: ServerLimits = from_values(ServerLimits, v)
    if sources["timeout"] != "default" and sources["body_timeout"] == "default":
        return replace(limits, body_timeout_s=limits.write_timeout_s)
    return limits


def _vision(
    m: ModelFlags, v: Mapping[str, Any], warnings: list[str]
) -> tuple[str | None, VisionSettings | None]:
    """The model's path and the vision settings, their files checked."""
    model = resolve_model_flag(m.model, "--model")  # a catalog name -> its joined GGUF
    if model is not None:
        check_gguf_file(model, "--model")
    vision_flags: VisionFlags = from_values(VisionFlags, v)
    if vision_flags.mmproj is not None:
        check_gguf_file(vision_flags.mmproj, "--mmproj")
    vision = vision_from_flags(vision_flags, m.threads, model)  # before weights load
    if vision is None and vision_flags.media_path is not None:
        warnings.append(MEDIA_PATH_WITHOUT_MMPROJ)
    return model, vision


def _engine(
    m: ModelFlags,
    model: str | None,
    vision: VisionSettings | None,
    flags: KVMemFlags,
    parsed: ParsedArgs,
) -> EngineSettings:
    """The engine's settings from the model, GPU, KV cache, --kvmem-* and --spec-* flags."""
    batch, ubatch = m.batch_size, m.ubatch_size
    if ubatch > batch:
        parsed.warnings.append(
            f"--ubatch-size {ubatch} is larger than --batch-size {batch}: using {batch}"
        )
        ubatch = batch
    threads = None if m.threads == -1 else m.threads
    engine = EngineSettings(
        model_path=model,
        n_ctx=m.ctx_size or 0,
        n_batch=batch,
        n_ubatch=ubatch,
        n_threads=threads,
        n_threads_batch=threads if m.threads_batch == -1 else m.threads_batch,
        n_gpu_layers=0 if m.device == ("none",) else m.gpu_layers,
        flash_attn=m.flash_attn is not FlashAttn.OFF,
        cache_types=flags.cache_types,
        kvmem=flags.kvmem,
        seed=parsed.values["seed"],
        load_mode=_load_mode(m, parsed.sources),
        spec=spec_config_from_args(parsed.namespace),  # --spec-* (declared on SpecConfig)
        vision=vision,
        placement=gpu_placement(m, parsed.sources, parsed.warnings),
        warmup=m.warmup,
    )
    engine.validate()
    return engine


def settings_from_parsed(
    parsed: ParsedArgs, environ: Mapping[str, str], gpu_probe: GpuProbe | None = None
) -> ServerSettings:
    v = parsed.values
    if v["metrics"] and importlib.util.find_spec("prometheus_client") is None:
        raise ConfigError("--metrics", "needs the prometheus-client package (pip install it)")
    m: ModelFlags = from_values(ModelFlags, v)
    _check_gpu_options(m)
    model, vision = _vision(m, v, parsed.warnings)
    template_flags: TemplateFlags = from_values(TemplateFlags, v)
    template, origin = _template(template_flags)
    keys = collect_api_keys(
        parsed.env_api_keys + v["api_key"], parsed.env_api_key_files + v["api_key_file"]
    )
    flags = kvmem_config_from_args(parsed.namespace, trace_env=trace_from_env(environ))
    lanes = _lanes(v["parallel"])
    if template_flags.jinja is False:
        parsed.warnings.append(
            "--no-jinja is ignored: kvmem-server always renders Jinja chat templates"
        )
    engine = _engine(m, model, vision, flags, parsed)
    engine, fit = fit_engine(engine, from_values(FitFlags, v), lanes, gpu_probe, parsed.given)
    return from_values(  # the fields that declare a flag; the rest given here
        ServerSettings,
        v,
        engine=engine,
        api_keys=keys,
        sampling=from_values(SamplingParams, v),
        chat_template=template,
        chat_template_origin=origin,
        thinking=_thinking(template_flags),
        ui_dir=_ui_dir(v["ui_dir"]),
        parallel=lanes,
        verbosity=_verbosity(from_values(LogFlags, v), v["verbosity"], parsed.sources),
        trace=flags.kvmem.trace,
        mmproj=None if vision is None else vision.mmproj,
        media_path=v["media_path"],
        sources={k: Source(s) for k, s in parsed.sources.items()},
        slot_save_path=_slot_dir(v["slot_save_path"]),
        limits=_limits(v, parsed.sources),
        fit=fit,
    )


def load_server_settings(
    argv: Sequence[str], environ: Mapping[str, str], gpu_probe: GpuProbe | None = None
) -> tuple[ServerSettings, list[str]]:
    """argv + environment -> settings and the warnings to log; ConfigError on any problem.
    `gpu_probe`: the GPU's free memory for --fit on (None: no GPU is known)."""
    parsed = parse_server_argv(argv, environ)
    settings = settings_from_parsed(parsed, environ, gpu_probe)
    return settings, parsed.warnings
