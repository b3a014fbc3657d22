"""Parsed flags -> validated `ServerSettings`, before any weights load.

Checks here: the single slot, multi-GPU options that cannot work, model/projector/
template/UI files, the chat template's syntax, API keys, the KVMem and KV-cache settings.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kvmem.chat.template import check_template_source, resolve_template_source
from kvmem.chat.thinking import ThinkingDefaults
from kvmem.cli.api_keys import collect_api_keys
from kvmem.cli.arg_types import FlashAttn, SplitMode
from kvmem.cli.gpu_placement import gpu_placement
from kvmem.cli.kvmem_flags import kvmem_config_from_args
from kvmem.cli.limit_flags import ServerLimits
from kvmem.cli.server_args import ParsedArgs, parse_server_argv
from kvmem.cli.server_settings import ServerSettings, Source
from kvmem.cli.spec_flags import spec_config_from_args
from kvmem.cli.vision_config import vision_from_values
from kvmem.engine.settings import MAX_LANES, EngineSettings
from kvmem.errors import ConfigError
from kvmem.models import resolve_model_flag
from kvmem.sampling import SamplingParams

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
def _lanes(v: dict[str, Any]) -> int:
    """--parallel N: 1 to MAX_LANES lanes (-1, llama.cpp's auto: 1)."""
    n = 1 if v["parallel"] == -1 else int(v["parallel"])
    if n > MAX_LANES:
        raise ConfigError(
            "--parallel",
            f"{n} lanes asked, at most {MAX_LANES} are supported "
            "(each lane is a context of budget + reserve cells)",
        )
    return n


# end of --parallel ------------------------------------------------------------------------


def _check_gpu_options(v: dict[str, Any], warnings: list[str]) -> None:
    devices = v["device"]
    assert isinstance(devices, tuple)
    if len(devices) > 1:
        raise ConfigError(
            "--device",
            "multi-GPU operation is not supported: select one device, e.g. --device CUDA0",
        )
    if v["split_mode"] in (SplitMode.ROW, SplitMode.TENSOR):
        raise ConfigError(
            "--split-mode",
            f"'{v['split_mode'].value}' splits across GPUs, which is not supported: "
            "use --split-mode none --main-gpu INDEX or layer on one GPU",
        )
    split = v["tensor_split"]
    assert isinstance(split, tuple)
    if sum(1 for x in split if x > 0) > 1:
        raise ConfigError(
            "--tensor-split", "multi-GPU operation is not supported: give at most one GPU a share"
        )


def _template(v: dict[str, Any]) -> tuple[str | None, str]:
    inline, path = v["chat_template"], v["chat_template_file"]
    if inline is not None and path is not None:
        raise ConfigError(
            "--chat-template", "give either --chat-template or --chat-template-file, not both"
        )
    if isinstance(path, str):
        try:
            source = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError("--chat-template-file", f"cannot read {path}: {exc}") from None
        check_template_source(source, "--chat-template-file")
        return source, path
    if isinstance(inline, str):
        source = resolve_template_source(inline)
        check_template_source(source, "--chat-template")
        return source, "--chat-template"
    return None, "gguf"


def _ui_dir(v: dict[str, Any]) -> str | None:
    ui_dir = v["ui_dir"]
    if not isinstance(ui_dir, str):
        return None
    if not (Path(ui_dir) / "index.html").is_file():
        raise ConfigError("--ui-dir", f"{ui_dir} is not a directory holding index.html")
    return ui_dir


def _slot_dir(v: dict[str, Any]) -> str | None:
    path = v["slot_save_path"]
    if path is None:
        return None
    if not Path(path).is_dir():
        raise ConfigError("--slot-save-path", f"{path} is not a directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError("--slot-save-path", f"{path} is not writable")
    return str(Path(path).resolve())


def _load_mode(v: dict[str, Any], sources: Mapping[str, str]) -> str:
    """-lm/--load-mode MODE, or llama.cpp's older switches: --no-mmap reads the file,
    --mlock locks the weights in RAM (mapped unless --no-mmap too), --mmap maps it."""
    if sources["load_mode"] != "default":
        return str(v["load_mode"])
    if v["mlock"]:
        return "mlock" if v["mmap"] is False else "mmap+mlock"
    if v["mmap"] is None:
        return "auto"
    return "mmap" if v["mmap"] else "none"


def _verbosity(v: dict[str, Any], sources: Mapping[str, str]) -> int:
    """-lv N; --log-disable silences everything; -v alone means -lv 5."""
    if v["log_disable"]:
        return 0
    if v["verbose"] and sources["verbosity"] == "default":
        return 5
    return int(v["verbosity"])


def _limits(v: dict[str, Any], sources: Mapping[str, str]) -> ServerLimits:
    """The resource bounds; -to/--timeout is the body deadline unless --body-timeout is set."""
    timeout_given = sources["timeout"] != "default"
    body_given = sources["body_timeout"] != "default"
    threads_http = int(v["threads_http"])
    return ServerLimits(
        max_body_bytes=int(v["max_body_size"]),
        header_timeout_s=float(v["header_timeout"]),
        body_timeout_s=float(
            v["timeout"] if timeout_given and not body_given else v["body_timeout"]
        ),
        keep_alive_timeout_s=float(v["keep_alive_timeout"]),
        max_connections=int(v["max_connections"]),
        cors_origins=tuple(v["cors_origins"]),
        cors_methods=tuple(v["cors_methods"]),
        cors_headers=tuple(v["cors_headers"]),
        cors_credentials=bool(v["cors_credentials"]),
        allowed_hosts=tuple(v["allowed_hosts"]),
        write_timeout_s=float(v["timeout"]),
        threads_http=threads_http if threads_http > 0 else None,
    )


def settings_from_parsed(parsed: ParsedArgs, environ: Mapping[str, str]) -> ServerSettings:
    v = parsed.values
    if v["metrics"] and importlib.util.find_spec("prometheus_client") is None:
        raise ConfigError("--metrics", "needs the prometheus-client package (pip install it)")
    _check_gpu_options(v, parsed.warnings)
    model = resolve_model_flag(v["model"], "--model")  # a catalog name -> its joined GGUF
    if model is not None:
        check_gguf_file(model, "--model")
    if v["mmproj"] is not None:
        check_gguf_file(str(v["mmproj"]), "--mmproj")
    vision = vision_from_values(v, model)  # vision (issue 12): checked before weights load
    template, origin = _template(v)
    keys = collect_api_keys(
        parsed.env_api_keys + v["api_key"], parsed.env_api_key_files + v["api_key_file"]
    )
    flags = kvmem_config_from_args(parsed.namespace, trace_env=trace_from_env(environ))
    lanes = _lanes(v)
    if v["jinja"] is False:
        parsed.warnings.append(
            "--no-jinja is ignored: kvmem-server always renders Jinja chat templates"
        )
    batch, ubatch = int(v["batch_size"]), int(v["ubatch_size"])
    if ubatch > batch:
        parsed.warnings.append(
            f"--ubatch-size {ubatch} is larger than --batch-size {batch}: using {batch}"
        )
        ubatch = batch
    threads = None if v["threads"] == -1 else v["threads"]
    threads_batch = threads if v["threads_batch"] == -1 else v["threads_batch"]
    engine = EngineSettings(
        model_path=model,
        n_ctx=v["ctx_size"] or 0,
        n_batch=batch,
        n_ubatch=ubatch,
        n_threads=threads,
        n_threads_batch=threads_batch,
        n_gpu_layers=0 if v["device"] == ("none",) else v["gpu_layers"],
        flash_attn=v["flash_attn"] is not FlashAttn.OFF,
        cache_types=flags.cache_types,
        kvmem=flags.kvmem,
        seed=v["seed"],
        load_mode=_load_mode(v, parsed.sources),
        spec=spec_config_from_args(parsed.namespace),  # --spec-* (cli/spec_flags.py)
        vision=vision,
        placement=gpu_placement(v, parsed.sources, parsed.warnings),
    )
    engine.validate()
    enable = v["reasoning"] if v["reasoning"] is not None else v["enable_thinking"]
    sampling = SamplingParams(
        temperature=v["temperature"],
        top_k=v["top_k"],
        top_p=v["top_p"],
        min_p=v["min_p"],
        repeat_penalty=v["repeat_penalty"],
        repeat_last_n=v["repeat_last_n"],
        presence_penalty=v["presence_penalty"],
        frequency_penalty=v["frequency_penalty"],
        seed=v["seed"],
    )
    sources = {k: Source(s) for k, s in parsed.sources.items()}
    return ServerSettings(
        engine=engine,
        host=str(v["host"]),
        port=int(v["port"]),
        alias=v["alias"],
        api_keys=keys,
        n_predict=int(v["n_predict"]),
        tool_max_tokens=int(v["tool_max_tokens"]),
        sampling=sampling,
        chat_template=template,
        chat_template_origin=origin,
        thinking=ThinkingDefaults(
            template_kwargs=dict(v["chat_template_kwargs"] or {}),
            reasoning_effort=None if v["reasoning_effort"] == "default" else v["reasoning_effort"],
            enable_thinking=enable,
            reasoning_budget=int(v["reasoning_budget"]),
        ),
        budget_message=str(v["reasoning_budget_message"]),
        ui=bool(v["ui"]),
        ui_dir=_ui_dir(v),
        metrics=bool(v["metrics"]),
        queue_size=int(v["queue_size"]),
        parallel=lanes,
        verbosity=_verbosity(v, parsed.sources),
        log_file=v["log_file"],
        reuse_port=bool(v["reuse_port"]),
        slots_endpoint=bool(v["slots"]),
        reasoning_format=str(v["reasoning_format"]),
        trace=flags.kvmem.trace,
        mmproj=v["mmproj"],
        mmproj_offload=bool(v["mmproj_offload"]),
        image_max_tokens=v["image_max_tokens"],
        image_min_tokens=v["image_min_tokens"],
        media_path=v["media_path"],
        devices=v["device"],
        split_mode=v["split_mode"].value,
        main_gpu=int(v["main_gpu"]),
        tensor_split=v["tensor_split"],
        sources=sources,
        slot_save_path=_slot_dir(v),
        limits=_limits(v, parsed.sources),
    )


def load_server_settings(
    argv: Sequence[str], environ: Mapping[str, str]
) -> tuple[ServerSettings, list[str]]:
    """argv + environment -> settings and the warnings to log; ConfigError on any problem."""
    parsed = parse_server_argv(argv, environ)
    settings = settings_from_parsed(parsed, environ)
    return settings, parsed.warnings
