"""Loading a GGUF model and describing it: the facts the session and the chat layer need."""

from __future__ import annotations

import ctypes
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp

from kvmem.engine_settings import GpuPlacement
from kvmem.errors import ModelLoadError
from kvmem.memory.rope import RopeParams, RopeType
from kvmem.settings.rpc_endpoints import LayerPlacement

from . import rpc
from .llama_lib import init_backend

logger = logging.getLogger(__name__)

# llama_rope_type values (llama.h)
_ROPE_TYPES = {0: RopeType.NORM, 2: RopeType.NEOX}
_ROPE_TYPE_MROPE_BIT = 8  # MROPE 8, VISION 24, IMROPE 40: positions with 2-D extensions


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What a loaded model is."""

    path: str
    name: str
    arch: str
    n_ctx: int  # the logical context (-c) this engine serves
    n_ctx_train: int
    n_vocab: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    rope: RopeParams | None  # None: a rope type KVMem cannot score with (e.g. M-RoPE)
    chat_template: str | None
    bos_token_id: int
    eos_token_id: int
    bos_text: str
    eos_text: str
    add_bos: bool
    # the texts of the control/user-defined tokens (template markup such as <|im_start|>)
    special_texts: tuple[str, ...] = ()
    max_token_chars: int = 0  # the longest token text in bytes (>= characters per token)
    layers: LayerPlacement | None = None  # each layer's device, from llama.cpp's load log


def apply_placement(placement: GpuPlacement, params: Any) -> Any:
    """Set `params`; returns the array llama.cpp reads during the load (keep it alive)."""
    modes = {"none": llama_cpp.LLAMA_SPLIT_MODE_NONE, "layer": llama_cpp.LLAMA_SPLIT_MODE_LAYER}
    params.split_mode = modes[placement.split_mode]
    params.main_gpu = placement.main_gpu
    if placement.tensor_split:
        n = int(llama_cpp.llama_max_devices())
        if len(placement.tensor_split) > n:
            raise ModelLoadError(
                f"--tensor-split has {len(placement.tensor_split)} shares; this build has {n} devices"
            )
        shares = (ctypes.c_float * n)(*placement.tensor_split)
        params.tensor_split = shares
        return shares
    return None


# llama.cpp's enum llama_load_mode by its -lm/--load-mode names
LOAD_MODES = {
    "auto": llama_cpp.LLAMA_LOAD_MODE_AUTO,
    "none": llama_cpp.LLAMA_LOAD_MODE_NONE,
    "mmap": llama_cpp.LLAMA_LOAD_MODE_MMAP,
    "mlock": llama_cpp.LLAMA_LOAD_MODE_MLOCK,
    "mmap+mlock": llama_cpp.LLAMA_LOAD_MODE_MMAP_MLOCK,
    "dio": llama_cpp.LLAMA_LOAD_MODE_DIRECT_IO,
}


class LlamaModel:
    """An owned `llama_model *` with its vocabulary."""

    def __init__(
        self,
        path: str,
        n_gpu_layers: int = -1,
        placement: GpuPlacement | None = None,
        load_mtp: bool = False,  # also load the nextn (MTP) layers' weights (draft-mtp)
        *,
        load_mode: str = "auto",  # -lm/--load-mode (--mmap/--no-mmap/--mlock): LOAD_MODES
    ) -> None:
        init_backend()
        params = llama_cpp.llama_model_default_params()
        params.load_mtp = load_mtp
        params.load_mode = LOAD_MODES[load_mode]
        params.n_gpu_layers = 0x7FFFFFFF if n_gpu_layers < 0 else n_gpu_layers
        keep_alive = apply_placement(placement, params) if placement is not None else None
        workers = placement.rpc if placement is not None else ()
        devices = rpc.model_devices(workers)  # None unless RPC workers are registered
        if devices is not None:
            params.devices = ctypes.cast(devices, ctypes.c_void_p)
        # llama.cpp's CPU "extra" buffer types (weight repacking, AMX) are off unless
        # KVMEM_CPU_EXTRA_BUFTS=1: a native build on a CPU that reports AMX inside a VM that
        # does not enable it dies with SIGILL (tilezero) on the first batch.
        params.use_extra_bufts = os.environ.get("KVMEM_CPU_EXTRA_BUFTS", "0") not in ("", "0")
        load_log: list[str] = []
        with rpc.captured_load_log(load_log):
            ptr = llama_cpp.llama_model_load_from_file(path.encode(), params)
        del keep_alive, devices
        # each layer's device as llama.cpp assigned it (/props, KVMEM_STARTUP)
        self.layers: LayerPlacement = rpc.layer_placement(load_log)
        if not ptr:
            raise ModelLoadError(f"llama.cpp failed to load the model {path}")
        self.ptr = ptr
        self.path = path
        self.vocab = llama_cpp.llama_model_get_vocab(ptr)

    @property
    def is_hybrid(self) -> bool:
        """Attention layers plus recurrent layers (qwen35, ...): a hybrid memory."""
        return bool(llama_cpp.llama_model_is_hybrid(self.ptr))

    @property
    def n_layer_nextn(self) -> int:
        """The MTP (nextn) blocks after the trunk (0: no MTP head)."""
        return int(llama_cpp.llama_model_n_layer_nextn(self.ptr))

    @property
    def is_recurrent(self) -> bool:
        return bool(llama_cpp.llama_model_is_recurrent(self.ptr))

    @property
    def kv_cell_ext(self) -> bool:
        """KV cells carry llama_kv_cell_ext in state blobs (M-RoPE models, e.g. qwen35)."""
        return bool(llama_cpp.llama_model_rope_type(self.ptr) & _ROPE_TYPE_MROPE_BIT)

    def tokenize(
        self, text: str, add_special: bool = False, parse_special: bool = True
    ) -> list[int]:
        data = text.encode("utf-8")
        n_max = len(data) + 16
        buf = (llama_cpp.llama_token * n_max)()
        n = llama_cpp.llama_tokenize(
            self.vocab, data, len(data), buf, n_max, add_special, parse_special
        )
        if n < 0:
            buf = (llama_cpp.llama_token * -n)()
            n = llama_cpp.llama_tokenize(
                self.vocab, data, len(data), buf, -n, add_special, parse_special
            )
        return list(buf[:n])

    def is_eog(self, token: int) -> bool:
        """An end-of-generation token (EOS, EOT, ...)."""
        return bool(llama_cpp.llama_vocab_is_eog(self.vocab, token))

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(4096)
        n = llama_cpp.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        if n < 0:
            return None
        if n >= len(buf):
            buf = ctypes.create_string_buffer(n + 1)
            llama_cpp.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace")

    def piece_text(self, token: int) -> str:
        return self.piece(token, special=True).decode("utf-8", "replace")

    def piece(self, token: int, special: bool = True) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def describe(self, n_ctx: int) -> ModelInfo:
        m = self.ptr
        arch = self.meta("general.architecture") or "unknown"
        n_head = llama_cpp.llama_model_n_head(m)
        n_embd = llama_cpp.llama_model_n_embd(m)
        key_length = self.meta(f"{arch}.attention.key_length")
        head_dim = int(key_length) if key_length else n_embd // max(n_head, 1)
        template = llama_cpp.llama_model_chat_template(m, None)
        bos = llama_cpp.llama_vocab_bos(self.vocab)
        eos = llama_cpp.llama_vocab_eos(self.vocab)
        return ModelInfo(
            path=self.path,
            name=Path(self.path).name,
            arch=arch,
            n_ctx=n_ctx,
            n_ctx_train=llama_cpp.llama_model_n_ctx_train(m),
            n_vocab=llama_cpp.llama_vocab_n_tokens(self.vocab),
            n_embd=n_embd,
            n_layer=llama_cpp.llama_model_n_layer(m),
            n_head=n_head,
            n_head_kv=llama_cpp.llama_model_n_head_kv(m),
            head_dim=head_dim,
            rope=self._rope_params(arch, head_dim),
            chat_template=template.decode("utf-8", "replace") if template else None,
            bos_token_id=bos,
            eos_token_id=eos,
            bos_text=self.piece_text(bos) if bos >= 0 else "",
            eos_text=self.piece_text(eos) if eos >= 0 else "",
            add_bos=bool(llama_cpp.llama_vocab_get_add_bos(self.vocab)),
            layers=self.layers,
            **self._token_facts(),
        )

    def _token_facts(self) -> dict[str, Any]:
        """special_texts and max_token_chars, from one pass over the vocabulary."""
        special_attrs = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED
        texts: list[str] = []
        longest = 1
        for token in range(llama_cpp.llama_vocab_n_tokens(self.vocab)):
            piece = self.piece(token, special=True)
            longest = max(longest, len(piece))
            if llama_cpp.llama_vocab_get_attr(self.vocab, token) & special_attrs and piece:
                texts.append(piece.decode("utf-8", "replace"))
        return {"special_texts": tuple(sorted(set(texts))), "max_token_chars": longest}

    def _rope_params(self, arch: str, head_dim: int) -> RopeParams | None:
        rope_type = _ROPE_TYPES.get(llama_cpp.llama_model_rope_type(self.ptr))
        if rope_type is None:
            return None
        n_rot = int(self.meta(f"{arch}.rope.dimension_count") or head_dim)
        base = float(self.meta(f"{arch}.rope.freq_base") or 10000.0)
        scale = 1.0
        scaling = self.meta(f"{arch}.rope.scaling.type")
        factor = self.meta(f"{arch}.rope.scaling.factor")
        if scaling == "linear" and factor:
            scale = 1.0 / float(factor)
        return RopeParams(rope_type=rope_type, n_rot=n_rot, freq_base=base, freq_scale=scale)

    def close(self) -> None:
        if self.ptr:
            llama_cpp.llama_model_free(self.ptr)
            self.ptr = None
