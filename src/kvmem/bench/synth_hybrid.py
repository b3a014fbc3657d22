"""The Qwen3.5 hybrid shape (llama.cpp arch `qwen35`) for the random-weight model writer.

Gated-delta-net (linear attention, recurrent) layers with a full-attention layer every
`full_attn_interval` layers, and optionally `nextn_layers` MTP blocks stored after the trunk.
Tensor names, shapes and hparam keys are the ones llama.cpp's `llama_model_qwen35`
(src/models/qwen35.cpp in the llama.cpp that llama-cpp-python 0.3.36 vendors) reads:

- every layer: attn_norm, post_attention_norm, ffn_gate/ffn_up/ffn_down
- attention layers: attn_q (query and output gate: 2 x n_head x head_dim rows), attn_k,
  attn_v, attn_output, attn_q_norm, attn_k_norm (per head_dim); IMROPE positions
- recurrent layers: attn_qkv (2 x key_dim + value_dim), attn_gate (value_dim), ssm_conv1d
  [conv_dim, d_conv] (f32), ssm_dt.bias, ssm_a (per value head), ssm_beta, ssm_alpha,
  ssm_norm (per head_v_dim), ssm_out; key_dim = d_state x n_group, value_dim = d_state x
  dt_rank (llama.cpp's names: n_group = key heads, dt_rank = value heads)
- MTP blocks: a full-attention block plus nextn.eh_proj [n_embd, 2 n_embd], nextn.enorm,
  nextn.hnorm (embed_tokens and the LM head are shared with the trunk)
"""

from __future__ import annotations

from dataclasses import dataclass

from gguf import GGUFWriter

from kvmem.bench.synth_model import Arch, TensorSpec
from kvmem.errors import ConfigError

# ssm_a = -exp(A_log) of the real model (negative: the per-token decay exp(softplus(.) * a) < 1)
SSM_A = -0.5


@dataclass(frozen=True, slots=True)
class Qwen35Shape:
    """Hyperparameters of a Qwen3.5 dense hybrid. The defaults are close to Qwen3.5-27B."""

    arch: Arch = Arch.QWEN35
    n_layer: int = 64  # trunk layers (MTP blocks come on top)
    n_embd: int = 5120
    n_head: int = 24
    n_head_kv: int = 4
    head_dim: int = 256
    n_ff: int = 17408
    n_ctx_train: int = 262144
    rope_base: float = 10_000_000.0
    rope_dim: int = 64  # rotated dims per head (partial RoPE)
    rope_sections: tuple[int, int, int, int] = (11, 11, 10, 0)  # IMROPE, sums to rope_dim / 2
    full_attn_interval: int = 4  # layer i is full attention when (i + 1) % interval == 0
    ssm_d_conv: int = 4
    ssm_d_state: int = 128  # head dim of the linear-attention keys and values
    ssm_n_group: int = 16  # linear-attention key heads
    ssm_dt_rank: int = 48  # linear-attention value heads
    nextn_layers: int = 0
    rms_eps: float = 1e-6

    @property
    def ssm_d_inner(self) -> int:
        return self.ssm_d_state * self.ssm_dt_rank

    @property
    def n_attention_layers(self) -> int:
        return self.n_layer // self.full_attn_interval

    def is_recurrent(self, il: int) -> bool:
        return il < self.n_layer and (il + 1) % self.full_attn_interval != 0

    def validate(self) -> None:
        for flag, value in (
            ("--n-layer", self.n_layer),
            ("--n-embd", self.n_embd),
            ("--n-head", self.n_head),
            ("--n-head-kv", self.n_head_kv),
            ("--head-dim", self.head_dim),
            ("--n-ff", self.n_ff),
            ("--n-ctx-train", self.n_ctx_train),
            ("--rope-dim", self.rope_dim),
            ("--full-attn-interval", self.full_attn_interval),
            ("--ssm-d-conv", self.ssm_d_conv),
            ("--ssm-d-state", self.ssm_d_state),
            ("--ssm-n-group", self.ssm_n_group),
            ("--ssm-dt-rank", self.ssm_dt_rank),
        ):
            if value <= 0:
                raise ConfigError(flag, f"must be a positive number, got {value}")
        if self.nextn_layers not in (0, 1):
            raise ConfigError(
                "--nextn-layers", f"llama.cpp's qwen35 supports 0 or 1, got {self.nextn_layers}"
            )
        if self.n_head % self.n_head_kv:
            raise ConfigError(
                "--n-head-kv", f"{self.n_head_kv} does not divide n_head {self.n_head}"
            )
        if self.ssm_dt_rank % self.ssm_n_group:
            raise ConfigError(
                "--ssm-n-group",
                f"{self.ssm_n_group} does not divide ssm_dt_rank {self.ssm_dt_rank}",
            )
        if self.n_layer < self.full_attn_interval:
            raise ConfigError(
                "--full-attn-interval",
                f"{self.full_attn_interval} leaves no attention layer in {self.n_layer} layers",
            )
        if self.rope_dim > self.head_dim or self.rope_dim % 2:
            raise ConfigError("--rope-dim", f"must be even and <= head_dim {self.head_dim}")
        if sum(self.rope_sections) != self.rope_dim // 2 or min(self.rope_sections) < 0:
            raise ConfigError(
                "--rope-sections",
                f"{list(self.rope_sections)} must be 4 non-negative numbers summing to "
                f"rope_dim / 2 = {self.rope_dim // 2}",
            )
        for name, dim in (
            ("--n-embd", self.n_embd),
            ("--n-ff", self.n_ff),
            ("--head-dim", self.head_dim),
            ("--ssm-d-state", self.ssm_d_state),
        ):
            if dim % 32:
                raise ConfigError(
                    name, f"must be a multiple of 32 (the Q8_0 block size), got {dim}"
                )
        if self.rope_base <= 0:
            raise ConfigError("--rope-base", f"must be positive, got {self.rope_base}")

    def tensors(self, n_vocab: int) -> list[TensorSpec]:
        e = self.n_embd
        specs = [TensorSpec("token_embd.weight", n_vocab, e, False)]
        for il in range(self.n_layer):
            blk = f"blk.{il}"
            specs += _norms(blk, e)
            specs += self._recurrent(blk) if self.is_recurrent(il) else self._attention(blk)
            specs += _ffn(blk, e, self.n_ff)
        for il in range(self.n_layer, self.n_layer + self.nextn_layers):
            blk = f"blk.{il}"
            specs += _norms(blk, e)
            specs += self._attention(blk)
            specs += _ffn(blk, e, self.n_ff)
            specs += [
                TensorSpec(f"{blk}.nextn.eh_proj.weight", e, 2 * e, False),
                TensorSpec(f"{blk}.nextn.enorm.weight", 1, e, True),
                TensorSpec(f"{blk}.nextn.hnorm.weight", 1, e, True),
            ]
        specs += [
            TensorSpec("output_norm.weight", 1, e, True),
            TensorSpec("output.weight", n_vocab, e, False),
        ]
        return specs

    def _attention(self, blk: str) -> list[TensorSpec]:
        e, hd = self.n_embd, self.head_dim
        kv = self.n_head_kv * hd
        return [
            TensorSpec(f"{blk}.attn_q.weight", 2 * self.n_head * hd, e, False),
            TensorSpec(f"{blk}.attn_k.weight", kv, e, False),
            TensorSpec(f"{blk}.attn_v.weight", kv, e, False),
            TensorSpec(f"{blk}.attn_output.weight", e, self.n_head * hd, False),
            TensorSpec(f"{blk}.attn_q_norm.weight", 1, hd, True),
            TensorSpec(f"{blk}.attn_k_norm.weight", 1, hd, True),
        ]

    def _recurrent(self, blk: str) -> list[TensorSpec]:
        e = self.n_embd
        key_dim = self.ssm_d_state * self.ssm_n_group
        value_dim = self.ssm_d_inner
        conv_dim = 2 * key_dim + value_dim
        return [
            TensorSpec(f"{blk}.attn_qkv.weight", conv_dim, e, False),
            TensorSpec(f"{blk}.attn_gate.weight", value_dim, e, False),
            TensorSpec(f"{blk}.ssm_conv1d.weight", conv_dim, self.ssm_d_conv, False, f32=True),
            TensorSpec(f"{blk}.ssm_dt.bias", 1, self.ssm_dt_rank, True, value=0.0),
            TensorSpec(f"{blk}.ssm_a", 1, self.ssm_dt_rank, True, value=SSM_A),
            TensorSpec(f"{blk}.ssm_beta.weight", self.ssm_dt_rank, e, False),
            TensorSpec(f"{blk}.ssm_alpha.weight", self.ssm_dt_rank, e, False),
            TensorSpec(f"{blk}.ssm_norm.weight", 1, self.ssm_d_state, True),
            TensorSpec(f"{blk}.ssm_out.weight", e, value_dim, False),
        ]

    def add_hparams(self, writer: GGUFWriter) -> None:
        a = self.arch.value
        writer.add_context_length(self.n_ctx_train)
        writer.add_embedding_length(self.n_embd)
        writer.add_block_count(self.n_layer + self.nextn_layers)
        writer.add_feed_forward_length(self.n_ff)
        writer.add_head_count(self.n_head)
        writer.add_head_count_kv(self.n_head_kv)
        writer.add_key_length(self.head_dim)
        writer.add_value_length(self.head_dim)
        writer.add_rope_dimension_count(self.rope_dim)
        writer.add_rope_freq_base(self.rope_base)
        writer.add_array(f"{a}.rope.dimension_sections", list(self.rope_sections))
        writer.add_layer_norm_rms_eps(self.rms_eps)
        writer.add_uint32(f"{a}.full_attention_interval", self.full_attn_interval)
        writer.add_uint32(f"{a}.ssm.conv_kernel", self.ssm_d_conv)
        writer.add_uint32(f"{a}.ssm.inner_size", self.ssm_d_inner)
        writer.add_uint32(f"{a}.ssm.state_size", self.ssm_d_state)
        writer.add_uint32(f"{a}.ssm.time_step_rank", self.ssm_dt_rank)
        writer.add_uint32(f"{a}.ssm.group_count", self.ssm_n_group)
        if self.nextn_layers:
            writer.add_uint32(f"{a}.nextn_predict_layers", self.nextn_layers)

    def describe(self, n_vocab: int) -> str:
        return (
            f"{self.arch.value}: {self.n_layer} layers ({self.n_attention_layers} full attention, "
            f"every {self.full_attn_interval}; {self.n_layer - self.n_attention_layers} "
            f"gated delta net) + {self.nextn_layers} MTP, n_embd {self.n_embd}, heads "
            f"{self.n_head}/{self.n_head_kv} (head_dim {self.head_dim}, rope {self.rope_dim}), "
            f"n_ff {self.n_ff}, ssm state {self.ssm_d_state} x {self.ssm_n_group}/"
            f"{self.ssm_dt_rank} heads, conv {self.ssm_d_conv}, n_vocab {n_vocab}, "
            f"n_ctx_train {self.n_ctx_train}, rope base {self.rope_base:g}"
        )


# A few-MB hybrid for CPU tests: 4 layers (full attention at layers 1 and 3), 2 KV heads.
QWEN35_TINY = Qwen35Shape(
    n_layer=4,
    n_embd=64,
    n_head=4,
    n_head_kv=2,
    head_dim=32,
    n_ff=128,
    n_ctx_train=8192,
    rope_dim=16,
    rope_sections=(3, 3, 2, 0),
    full_attn_interval=2,
    ssm_d_state=32,
    ssm_n_group=2,
    ssm_dt_rank=4,
)
QWEN35_27B = Qwen35Shape()
PRESETS = {"27b": QWEN35_27B, "tiny": QWEN35_TINY}


def _norms(blk: str, n_embd: int) -> list[TensorSpec]:
    return [
        TensorSpec(f"{blk}.attn_norm.weight", 1, n_embd, True),
        TensorSpec(f"{blk}.post_attention_norm.weight", 1, n_embd, True),
    ]


def _ffn(blk: str, n_embd: int, n_ff: int) -> list[TensorSpec]:
    return [
        TensorSpec(f"{blk}.ffn_gate.weight", n_ff, n_embd, False),
        TensorSpec(f"{blk}.ffn_up.weight", n_ff, n_embd, False),
        TensorSpec(f"{blk}.ffn_down.weight", n_embd, n_ff, False),
    ]
