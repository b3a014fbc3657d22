"""The llama.cpp adapter: the only package that imports llama_cpp."""

from kvmem.memory.spans import PromptSpans, TokenSpan

from .engine import Engine, EngineSettings
from .lanes import MAX_LANES, EngineLanes
from .model import GpuPlacement, ModelInfo, default_model_path, resolve_model_path
from .sampler import SamplingParams
from .session import KVMemSession
from .trace import EngineStats, FinishReason, TurnStats

__all__ = [
    "Engine",
    "EngineLanes",
    "EngineSettings",
    "EngineStats",
    "FinishReason",
    "KVMemSession",
    "GpuPlacement",
    "MAX_LANES",
    "ModelInfo",
    "PromptSpans",
    "SamplingParams",
    "TokenSpan",
    "TurnStats",
    "default_model_path",
    "resolve_model_path",
]
