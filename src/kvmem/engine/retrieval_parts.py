"""What retrieval needs of a loaded model: the key geometry, the query capture on the
main context's eval callback, and the background index of block summaries."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass

from kvmem.engine_settings import EngineSettings
from kvmem.errors import ConfigError
from kvmem.memory.planner import RetrievalMethod
from kvmem.memory.retrieval_index import KeyGeometry, default_score_layers
from kvmem.memory.rope import k_rotation_size

from .llama.llama_lib import ggml_base
from .llama.model import ModelInfo
from .query.background_index import BackgroundIndex
from .query.query_capture import QueryCapture, capture_staging

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RetrievalParts:
    index: BackgroundIndex | None  # block summaries (the retrieval method only)
    capture: QueryCapture | None  # the query rows (recency captures too, for coverage)
    geometry: KeyGeometry | None  # None: no scoring on this model or with these settings


NO_RETRIEVAL = RetrievalParts(None, None, None)


def background_index(geometry: KeyGeometry, layers: Sequence[int]) -> BackgroundIndex:
    workers = max(1, min(4, (os.cpu_count() or 2) // 4))
    return BackgroundIndex(geometry, layers, workers)


def key_geometry(settings: EngineSettings, info: ModelInfo) -> KeyGeometry:
    assert info.rope is not None
    k_type = settings.cache_types.k
    rotation = 0
    if k_type.is_quantized and os.environ.get("LLAMA_ATTN_ROT_DISABLE", "0") in ("", "0"):
        rotation = k_rotation_size(info.head_dim)
    return KeyGeometry(
        n_layer=info.n_layer,
        n_head_kv=info.n_head_kv,
        head_dim=info.head_dim,
        k_type=k_type,
        rope=info.rope,
        k_rotation=rotation,
    )


def retrieval_parts(settings: EngineSettings, info: ModelInfo) -> RetrievalParts:
    kv = settings.kvmem
    if not kv.enabled:
        return NO_RETRIEVAL
    if not settings.query_capture:
        logger.info("no eval callback on the main context: the window is recency")
        return NO_RETRIEVAL
    if info.rope is None:
        logger.warning("rope type not supported for scoring: falling back to recency")
        return NO_RETRIEVAL
    layers = kv.score_layers or default_score_layers(info.n_layer)
    if any(layer >= info.n_layer for layer in layers):
        raise ConfigError("--kvmem-score-layers", f"the model has {info.n_layer} layers")
    geometry = key_geometry(settings, info)
    capture = QueryCapture(ggml_base(), layers, gate=settings.eval_gate, staging=capture_staging())
    if kv.method is not RetrievalMethod.RETRIEVAL:
        return RetrievalParts(None, capture, geometry)  # recency needs no block summaries
    return RetrievalParts(background_index(geometry, layers), capture, geometry)
