"""The llama.cpp adapter: the only package that imports llama_cpp.

Public names load lazily (PEP 562), so importing a numpy-only module of this package, or a
record such as ``GpuPlacement``, does not load llama_cpp.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvmem.memory.spans import PromptSpans, TokenSpan

    from .engine import Engine
    from .lanes import EngineLanes
    from .model import ModelInfo
    from .model_path import default_model_path, resolve_model_path
    from .session import KVMemSession
    from .settings import MAX_LANES, EngineSettings, GpuPlacement
    from .trace import EngineStats, FinishReason, TurnStats

_HOMES = {
    "Engine": ".engine",
    "EngineSettings": ".settings",
    "EngineLanes": ".lanes",
    "MAX_LANES": ".settings",
    "GpuPlacement": ".settings",
    "ModelInfo": ".model",
    "default_model_path": ".model_path",
    "resolve_model_path": ".model_path",
    "KVMemSession": ".session",
    "EngineStats": ".trace",
    "FinishReason": ".trace",
    "TurnStats": ".trace",
    "PromptSpans": "kvmem.memory.spans",
    "TokenSpan": "kvmem.memory.spans",
}

__all__ = [
    "Engine",
    "EngineLanes",
    "EngineSettings",
    "EngineStats",
    "FinishReason",
    "GpuPlacement",
    "KVMemSession",
    "MAX_LANES",
    "ModelInfo",
    "PromptSpans",
    "TokenSpan",
    "TurnStats",
    "default_model_path",
    "resolve_model_path",
]


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))
