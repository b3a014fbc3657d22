"""The engine's settings records: what to load, where, and how (no llama_cpp).

The CLI and the server build and validate these before any weights load; `Engine` and
`LlamaModel` read them. They sit outside `kvmem.engine` so that the CLI imports no engine
module (tests/unit/test_layering.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvmem.config import KVCacheTypes, KVMemConfig
from kvmem.errors import ConfigError
from kvmem.gguf.k_shift_meta import check_quantized_k_shift
from kvmem.gguf.model_path import resolve_model_path
from kvmem.gguf.nextn_meta import check_mtp_head
from kvmem.memory.layout import PositionMode
from kvmem.settings.rpc_endpoints import RpcEndpoint
from kvmem.spec_config import SpecConfig

MAX_LANES = 4  # --parallel: engines sharing one model
STAGING_BYTES = 1 << 30  # the reused (pinned) blob buffer; larger restores go in pieces


@dataclass(frozen=True, slots=True)
class GpuPlacement:
    """Where the weights go: llama.cpp's split_mode, main_gpu and tensor_split
    (`--split-mode`, `--main-gpu`, `--tensor-split`, `--device`)."""

    split_mode: str = "layer"  # none | layer
    main_gpu: int = 0
    tensor_split: tuple[float, ...] = ()
    # --rpc: RPC workers whose devices join the layer split, before the local GPUs
    rpc: tuple[RpcEndpoint, ...] = ()


@dataclass(frozen=True, slots=True)
class VisionSettings:
    mmproj: str
    offload: bool = True  # the projector on the GPU (where the build has one)
    image_min_tokens: int = 0  # 0: the projector's own bound
    image_max_tokens: int = 0
    n_threads: int = 4
    cache_bytes: int = 1 << 30  # encoded images kept (LRU), at least the history's


@dataclass(frozen=True, slots=True)
class EngineSettings:
    model_path: str | None = None  # None: the embedded default model
    n_ctx: int = 0  # logical context; 0 = the model's training context
    n_batch: int = 2048
    n_ubatch: int = 512
    n_threads: int | None = None
    n_threads_batch: int | None = None
    n_gpu_layers: int = -1
    flash_attn: bool = True
    offload_kqv: bool = True
    cache_types: KVCacheTypes = field(default_factory=KVCacheTypes)
    kvmem: KVMemConfig = field(default_factory=KVMemConfig)
    seed: int = -1
    # how llama.cpp loads the weights (-lm/--load-mode; --mmap/--no-mmap/--mlock): auto,
    # none, mmap, mlock, mmap+mlock or dio (kvmem.engine.model.LOAD_MODES)
    load_mode: str = "auto"
    eval_gate: bool = True  # the native gate in front of the eval callback (eval_gate.py)
    # False: the main context gets no eval callback at all, so no query capture and no
    # retrieval (the window is recency); kvmem-bench decode-sweep measures what the
    # callback itself costs with it
    query_capture: bool = True
    staging_bytes: int = STAGING_BYTES  # reused blob buffer of harvest/restore; 0 = none
    spec: SpecConfig = field(default_factory=SpecConfig)  # speculative decoding
    vision: VisionSettings | None = None  # --mmproj: images through mtmd
    placement: GpuPlacement = field(default_factory=GpuPlacement)  # --split-mode/--main-gpu/-ts
    # --warmup: one scratch decode on the main context at load, before any session is
    # restored or used (kvmem-server's default; off for kvmem-cli, the bench and the API)
    warmup: bool = False

    def validate(self) -> None:
        if self.n_ctx < 0:
            raise ConfigError("-c", f"context size must be positive, got {self.n_ctx}")
        if self.n_batch <= 0:
            raise ConfigError("-b", f"batch size must be positive, got {self.n_batch}")
        if self.n_ubatch <= 0:
            raise ConfigError("-ub", f"ubatch size must be positive, got {self.n_ubatch}")
        self.cache_types.validate()
        self.kvmem.validate()
        self.spec.validate()
        if self.spec.wants_mtp:  # from the GGUF's metadata, before any weights load
            check_mtp_head(resolve_model_path(self.model_path))
        if self.cache_types.v.is_quantized and not self.flash_attn:
            raise ConfigError("-ctv", "a quantized V cache needs flash attention (-fa on)")
        moves = self.kvmem.enabled and self.kvmem.positions is not PositionMode.ORIGINAL
        if moves and self.cache_types.k.is_quantized:  # gguf/k_shift_meta.py says why
            check_quantized_k_shift(resolve_model_path(self.model_path), self.kvmem.positions)
