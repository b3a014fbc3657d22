"""A random-weight vision projector (a llava-style CLIP encoder + MLP) that llama.cpp's mtmd
loads, for the mechanics tests of image input: no real vision model is available offline.

The file is an ordinary mmproj GGUF (architecture "clip", projector type "mlp"): a patch
convolution, learned position embeddings, `n_layer` pre-norm ViT blocks and a two-layer GELU
MLP into the text model's embedding size. An image becomes (image_size / patch_size)^2 rows.
The weights are small random numbers from a seeded RNG, so the same arguments always write the
same bytes; the embeddings mean nothing, which is all the window mechanics need.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFWriter

from kvmem.errors import ConfigError

logger = logging.getLogger(__name__)

# CLIP's normalisation constants: any three means/stds would do, these are the usual ones.
_IMAGE_MEAN = (0.48145466, 0.4578275, 0.40821073)
_IMAGE_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True, slots=True)
class MmprojShape:
    """The vision tower's shape. `n_embd_text` must equal the text model's embedding size."""

    n_embd_text: int = 576  # SmolLM2-135M
    image_size: int = 64
    patch_size: int = 16
    n_embd: int = 64
    n_head: int = 4
    n_ff: int = 128
    n_layer: int = 2
    n_mlp: int = 256  # hidden width of the projector MLP

    @property
    def n_patches(self) -> int:
        """Rows one image occupies in the text model (the fixed-size llava preprocessing)."""
        return (self.image_size // self.patch_size) ** 2

    def validate(self) -> None:
        for flag, value in (
            ("--n-embd-text", self.n_embd_text),
            ("--image-size", self.image_size),
            ("--patch-size", self.patch_size),
            ("--vision-n-embd", self.n_embd),
            ("--vision-n-head", self.n_head),
            ("--vision-n-layer", self.n_layer),
        ):
            if value <= 0:
                raise ConfigError(flag, f"must be a positive number, got {value}")
        if self.image_size % self.patch_size:
            raise ConfigError(
                "--patch-size", f"{self.patch_size} does not divide --image-size {self.image_size}"
            )
        if self.n_embd % self.n_head:
            raise ConfigError(
                "--vision-n-head", f"{self.n_head} does not divide the vision n_embd {self.n_embd}"
            )


def _tensors(shape: MmprojShape, seed: int) -> list[tuple[str, np.ndarray]]:
    """(name, float32 array in numpy order, i.e. reversed ggml ne) for every tensor."""
    rng = np.random.default_rng(seed)
    d, p = shape.n_embd, shape.patch_size

    def rand(*dims: int, fan_in: int) -> np.ndarray:
        return (rng.standard_normal(dims) / np.sqrt(fan_in)).astype(np.float32)

    def const(n: int, value: float) -> np.ndarray:
        return np.full(n, value, dtype=np.float32)

    out: list[tuple[str, np.ndarray]] = [
        ("v.patch_embd.weight", rand(d, 3, p, p, fan_in=3 * p * p)),
        ("v.patch_embd.bias", const(d, 0.0)),
        ("v.position_embd.weight", rand(shape.n_patches, d, fan_in=d)),
        ("v.pre_ln.weight", const(d, 1.0)),
        ("v.pre_ln.bias", const(d, 0.0)),
    ]
    for il in range(shape.n_layer):
        blk = f"v.blk.{il}"
        for part in ("attn_q", "attn_k", "attn_v", "attn_out"):
            out.append((f"{blk}.{part}.weight", rand(d, d, fan_in=d)))
            out.append((f"{blk}.{part}.bias", const(d, 0.0)))
        for norm in ("ln1", "ln2"):
            out.append((f"{blk}.{norm}.weight", const(d, 1.0)))
            out.append((f"{blk}.{norm}.bias", const(d, 0.0)))
        out.append((f"{blk}.ffn_up.weight", rand(shape.n_ff, d, fan_in=d)))
        out.append((f"{blk}.ffn_up.bias", const(shape.n_ff, 0.0)))
        out.append((f"{blk}.ffn_down.weight", rand(d, shape.n_ff, fan_in=shape.n_ff)))
        out.append((f"{blk}.ffn_down.bias", const(d, 0.0)))
    out += [
        ("mm.0.weight", rand(shape.n_mlp, d, fan_in=d)),
        ("mm.0.bias", const(shape.n_mlp, 0.0)),
        ("mm.2.weight", rand(shape.n_embd_text, shape.n_mlp, fan_in=shape.n_mlp)),
        ("mm.2.bias", const(shape.n_embd_text, 0.0)),
    ]
    return out


def write_mmproj(path: Path, shape: MmprojShape, *, seed: int = 0) -> Path:
    """Write the projector GGUF at `path` (parent directories created) and return it."""
    shape.validate()
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = GGUFWriter(str(path), "clip")
    writer.add_name("kvmem synthetic vision projector")
    writer.add_description(f"random weights, seed {seed}; {shape.n_patches} rows per image")
    writer.add_string("clip.projector_type", "mlp")
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_bool("clip.has_audio_encoder", False)
    writer.add_bool("clip.use_gelu", True)
    writer.add_uint32("clip.vision.image_size", shape.image_size)
    writer.add_uint32("clip.vision.patch_size", shape.patch_size)
    writer.add_uint32("clip.vision.embedding_length", shape.n_embd)
    writer.add_uint32("clip.vision.feed_forward_length", shape.n_ff)
    writer.add_uint32("clip.vision.block_count", shape.n_layer)
    writer.add_uint32("clip.vision.projection_dim", shape.n_embd_text)
    writer.add_uint32("clip.vision.attention.head_count", shape.n_head)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    writer.add_array("clip.vision.image_mean", list(_IMAGE_MEAN))
    writer.add_array("clip.vision.image_std", list(_IMAGE_STD))
    for name, data in _tensors(shape, seed):
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    logger.info("wrote projector %s (%d rows per image)", path, shape.n_patches)
    return path
