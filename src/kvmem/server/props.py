"""Bodies of `/v1/models` and `/props` (llama-server-like; never any API key)."""

from __future__ import annotations

import importlib.metadata
import time
from dataclasses import asdict
from typing import Any

from kvmem import __version__
from kvmem.chat.protocol import ModelInfoLike
from kvmem.chat.template import ChatTemplate
from kvmem.server.settings import ServerSettings
from kvmem.server.ui_files import ui_props

_STARTED = int(time.time())
PROCESS_STARTED = _STARTED  # the Process-Start-Time-Unix header of /metrics


def build_info() -> str:
    try:
        llama = importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        llama = "unknown"
    return f"kvmem {__version__} (llama-cpp-python {llama})"


def system_fingerprint() -> str:
    """llama-server's `b<build>-<commit>` form: the vendored llama-cpp-python release as the
    build and KVMem's version as the commit."""
    try:
        llama = importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        llama = "0"
    return f"b{llama}-kvmem{__version__}"


def served_model_id(settings: ServerSettings, info: ModelInfoLike) -> str:
    """--alias, else the model file's name."""
    return settings.alias or info.path.replace("\\", "/").rsplit("/", 1)[-1]


def models_body(settings: ServerSettings, info: ModelInfoLike) -> dict[str, Any]:
    model_id = served_model_id(settings, info)
    meta = {"n_ctx": info.n_ctx, "n_ctx_train": info.n_ctx_train, "n_vocab": info.n_vocab}
    entry = {
        "id": model_id,
        "object": "model",
        "created": _STARTED,
        "owned_by": "kvmem",
        "meta": meta,
    }
    return {
        "object": "list",
        "data": [entry],
        "models": [{"name": model_id, "model": model_id, "meta": meta}],
    }


def gpu_cells(settings: ServerSettings, n_ctx: int) -> int:
    """KV cells of all lanes' contexts: N x (budget + reserve), each at most n_ctx."""
    kv = settings.engine.kvmem
    per_lane = min(kv.gpu_cells, n_ctx) if kv.enabled else n_ctx
    return settings.parallel * per_lane


def kvmem_body(settings: ServerSettings, n_ctx: int) -> dict[str, Any]:
    kv = settings.engine.kvmem
    return {
        "lanes": settings.parallel,
        "gpu_cells": gpu_cells(settings, n_ctx),
        "enabled": kv.enabled,
        "block_tokens": kv.block_tokens,
        "budget": kv.budget,
        "gen_reserve": kv.gen_reserve,
        "sink_blocks": kv.sink_blocks,
        "recent_blocks": kv.recent_blocks,
        "neighbor_blocks": kv.neighbor_blocks,
        "method": kv.method.value,
        "query_replay": kv.query_replay.value,
        "query_policy": kv.query_policy.value,
        "query_source": kv.query_source.value,
        "query_max_tokens": kv.query_max_tokens,
        "tier_tokens": kv.tier_tokens(),
        "score_layers": list(kv.score_layers),
        "score_mode": kv.score_mode.value,
        "score_aggregate": kv.score_aggregate.value,
        "score_mlogits": kv.score_mlogits,
        "score_threads": kv.score_workers,
        "positions": kv.positions.value,
        "cache_type_k": settings.engine.cache_types.k.label,
        "cache_type_v": settings.engine.cache_types.v.label,
        "fit": settings.fit.as_dict() if settings.fit is not None else None,  # --fit on
    }


def props_body(
    settings: ServerSettings, info: ModelInfoLike, template: ChatTemplate
) -> dict[str, Any]:
    s = settings.sampling
    params = {
        "temperature": s.temperature,
        "top_k": s.top_k,
        "top_p": s.top_p,
        "min_p": s.min_p,
        "repeat_penalty": s.repeat_penalty,
        "repeat_last_n": s.repeat_last_n,
        "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty,
        "seed": s.seed,
        "n_predict": settings.n_predict,
        "max_tokens": settings.n_predict,
        "reasoning_budget_tokens": settings.thinking.reasoning_budget,
    }
    thinking = settings.thinking
    return {
        "default_generation_settings": {"id": 0, "n_ctx": info.n_ctx, "params": params},
        "total_slots": settings.parallel,  # --parallel lanes
        "model_alias": served_model_id(settings, info),
        "model_path": info.path,
        "n_ctx": info.n_ctx,
        "n_ctx_train": info.n_ctx_train,
        "modalities": {"vision": settings.mmproj is not None, "audio": False},
        "chat_template": template.source,
        "chat_template_source": settings.chat_template_origin,
        "chat_template_caps": asdict(template.caps),
        "tool_call_format": template.tool_format.value,
        "thinking": {
            "tags": [template.reasoning.open, template.reasoning.close]
            if template.reasoning
            else None,
            "template_kwargs": dict(thinking.template_kwargs),
            "reasoning_effort": thinking.reasoning_effort or "default",
            "enable_thinking": thinking.enable_thinking,
            "reasoning_budget": thinking.reasoning_budget,
        },
        "bos_token": info.bos_text,
        "eos_token": info.eos_text,
        "build_info": build_info(),
        **ui_props(settings),
        "auth": {"enabled": settings.api_keys.enabled},
        # requests rendered, and those whose prompt spans were not found (chat.prompt)
        "kvmem": {**kvmem_body(settings, info.n_ctx), "prompt_spans": template.counters.snapshot()},
        "speculative": settings.engine.spec.describe(),
    }
