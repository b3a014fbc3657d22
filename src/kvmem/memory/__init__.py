"""KVMem's memory core: block table, host store, retrieval index, scoring, planning, RoPE math.

numpy (and gguf for dequantization) only: this package never imports llama_cpp or the
engine, server, chat or CLI packages (tests/unit/test_layering.py enforces it).
"""

from kvmem.memory.block_table import BlockInfo, BlockTable, TruncateResult
from kvmem.memory.ggml_types import GgmlType, dequantize_rows, parse_kv_type
from kvmem.memory.host_store import BlockKV, BlockStore, HostStore, HostStoreStats
from kvmem.memory.planner import (
    PlannerConfig,
    RetrievalMethod,
    Tier,
    WindowPlan,
    WindowRequest,
    plan_window,
    ranked_candidates,
    stream_window,
    window_slots,
)
from kvmem.memory.retrieval_index import KeyGeometry, RetrievalIndex
from kvmem.memory.rope import (
    RopeParams,
    RopeType,
    apply_rope,
    hadamard_matrix,
    k_rotation_size,
    remove_rope,
    undo_hadamard,
)
from kvmem.memory.scorer import QueryVectors, score_blocks
from kvmem.memory.spans import PromptSpans, TokenSpan

__all__ = [
    "BlockInfo",
    "BlockKV",
    "BlockStore",
    "BlockTable",
    "GgmlType",
    "HostStore",
    "HostStoreStats",
    "KeyGeometry",
    "PlannerConfig",
    "QueryVectors",
    "RetrievalIndex",
    "RetrievalMethod",
    "RopeParams",
    "RopeType",
    "TruncateResult",
    "PromptSpans",
    "Tier",
    "TokenSpan",
    "WindowPlan",
    "WindowRequest",
    "apply_rope",
    "dequantize_rows",
    "hadamard_matrix",
    "k_rotation_size",
    "parse_kv_type",
    "plan_window",
    "ranked_candidates",
    "remove_rope",
    "score_blocks",
    "stream_window",
    "undo_hadamard",
    "window_slots",
]
