"""`kvmem-bench synth-mmproj`: write a random-weight vision projector for a text model."""

from __future__ import annotations

import argparse
from pathlib import Path

from kvmem.bench.synth_mmproj import MmprojShape, write_mmproj
from kvmem.cli.kvmem_flags import strict_int

_DEFAULT = MmprojShape()


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "synth-mmproj",
        help="write a random-weight vision projector (llava-style CLIP + MLP) mtmd loads",
        description="Write a random-weight mmproj GGUF (projector type mlp) whose output size "
        "matches a text model, for the mechanics tests of image input: an image becomes "
        "(image-size / patch-size)^2 rows. The default fits SmolLM2-135M (576).",
    )
    p.add_argument("out", type=Path, metavar="OUT.gguf")
    p.add_argument(
        "--n-embd-text",
        type=strict_int,
        default=_DEFAULT.n_embd_text,
        help="the text model's embedding size (default %(default)s: SmolLM2-135M)",
    )
    p.add_argument("--image-size", type=strict_int, default=_DEFAULT.image_size)
    p.add_argument("--patch-size", type=strict_int, default=_DEFAULT.patch_size)
    p.add_argument("--vision-n-embd", type=strict_int, default=_DEFAULT.n_embd)
    p.add_argument("--vision-n-head", type=strict_int, default=_DEFAULT.n_head)
    p.add_argument("--vision-n-layer", type=strict_int, default=_DEFAULT.n_layer)
    p.add_argument("--seed", type=strict_int, default=0)
    p.set_defaults(handler=run)


def run(ns: argparse.Namespace) -> int:
    shape = MmprojShape(
        n_embd_text=ns.n_embd_text,
        image_size=ns.image_size,
        patch_size=ns.patch_size,
        n_embd=ns.vision_n_embd,
        n_head=ns.vision_n_head,
        n_ff=2 * ns.vision_n_embd,
        n_layer=ns.vision_n_layer,
    )
    path = write_mmproj(ns.out, shape, seed=ns.seed)
    print(f"wrote {path}: {shape.n_patches} rows per image, output size {shape.n_embd_text}")
    return 0
