"""`kvmem-bench vision`: image encode time, and the decode rate in a long window with and
without one image in it.

The projector is a given mmproj GGUF or, by default, a random-weight one matched to the
model (bench/synth_mmproj.py: CLIP-like 336 px / 14 px patches, 576 rows per image), so
the numbers are the mechanics' cost (encoding, embedding-row prefill, a window holding
image rows), not a real vision model's quality. Both runs decode after a prompt of the
same length: random text tokens, and the same with one image's rows near the start.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from kvmem.bench.report import format_table, machine_description, write_json
from kvmem.bench.synth_mmproj import MmprojShape, write_mmproj
from kvmem.cli.kvmem_flags import strict_int
from kvmem.config import KVMemConfig
from kvmem.engine_settings import EngineSettings, VisionSettings
from kvmem.errors import ConfigError
from kvmem.gguf.mmproj_meta import model_embd
from kvmem.gguf.model_path import resolve_model_path
from kvmem.models import resolve_model_flag
from kvmem.sampling import SamplingParams
from kvmem.settings.values import gpu_layers

if TYPE_CHECKING:
    from kvmem.engine.engine import Engine

logger = logging.getLogger(__name__)

GREEDY = SamplingParams(temperature=0.0)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "vision",
        help="image encode time and decode tok/s with/without an image in the window",
        description=__doc__,
    )
    p.add_argument("-m", "--model", default=None, help="GGUF or catalog name (default SmolLM2)")
    p.add_argument("--mmproj", default=None, help="projector GGUF (default: a synthetic one)")
    p.add_argument("--context", type=strict_int, default=32768, help="window and prompt size")
    p.add_argument("--gen", type=strict_int, default=64, help="tokens decoded per run")
    p.add_argument("--images", type=strict_int, default=3, help="distinct images encoded")
    p.add_argument("--image-size", type=strict_int, default=336, help="synthetic projector")
    p.add_argument("--patch-size", type=strict_int, default=14, help="synthetic projector")
    p.add_argument("-ngl", "--gpu-layers", type=gpu_layers, default=-1)
    p.add_argument("--no-mmproj-offload", action="store_true")
    p.add_argument("-t", "--threads", type=strict_int, default=None)
    p.add_argument("--json-out", default=None, metavar="DIR", help="write DIR/vision.json")
    p.set_defaults(handler=run)


def _rgb(seed: int) -> tuple[str, int, int, bytes]:
    data = np.random.default_rng(seed).integers(0, 256, (480, 640, 3), dtype=np.uint8).tobytes()
    return hashlib.sha256(data).hexdigest(), 640, 480, data


def _turn(engine: Engine, prompt: list[int], gen: int) -> dict[str, float]:
    engine.reset()
    out = list(engine.generate(prompt, sampling=GREEDY, max_tokens=gen, ignore_eos=True))
    t = engine.last_turn
    return {
        "prompt_tokens": len(prompt),
        "prefill_ms": round(t.prefill_ms, 1),
        "prefill_tok_s": round(len(prompt) / (t.prefill_ms / 1e3), 1) if t.prefill_ms else 0.0,
        "generated": len(out),
        "decode_tok_s": round(len(out) / (t.decode_ms / 1e3), 2) if t.decode_ms else 0.0,
    }


def run(ns: argparse.Namespace) -> int:
    from kvmem.engine.engine import Engine  # loads llama.cpp

    model = resolve_model_path(resolve_model_flag(ns.model, "--model"))
    with tempfile.TemporaryDirectory() as tmp:
        mmproj = ns.mmproj
        if mmproj is None:
            shape = MmprojShape(
                n_embd_text=model_embd(model), image_size=ns.image_size, patch_size=ns.patch_size
            )
            mmproj = str(write_mmproj(Path(tmp) / "mmproj.gguf", shape))
        settings = EngineSettings(
            model_path=model,
            n_ctx=ns.context + ns.gen + 8,
            n_threads=ns.threads,
            n_threads_batch=ns.threads,
            n_gpu_layers=ns.gpu_layers,
            kvmem=KVMemConfig(budget=max(512, ns.context), gen_reserve=max(128, ns.gen)),
            vision=VisionSettings(
                mmproj, offload=not ns.no_mmproj_offload, n_threads=ns.threads or 4
            ),
        )
        engine = Engine(settings)
        try:
            result = _measure(engine, ns)
        finally:
            engine.close()
    result.update(
        model=Path(model).name, mmproj=ns.mmproj or "synthetic", machine=machine_description()
    )
    rows = [
        [k, v["prompt_tokens"], v["prefill_tok_s"], v["generated"], v["decode_tok_s"]]
        for k, v in (("text", result["text"]), ("image", result["image"]))
    ]
    print(f"image: {result['rows_per_image']} rows; encode ms {result['encode_ms']}")
    print(format_table(["prompt", "tokens", "prefill tok/s", "gen", "decode tok/s"], rows))
    write_json(ns.json_out, "vision.json", result)
    return 0


def _measure(engine: Engine, ns: argparse.Namespace) -> dict:
    encode_ms = []
    items: list[int] = []
    for i in range(max(1, ns.images)):
        t0 = time.perf_counter()
        items = engine.image_items(*_rgb(i))
        encode_ms.append(round((time.perf_counter() - t0) * 1e3, 1))
    n_vocab = engine.info.n_vocab
    n_prompt = ns.context - ns.gen - 1
    if len(items) + 32 > n_prompt:
        raise ConfigError(
            "--context", f"{ns.context} leaves no room for an image of {len(items)} rows"
        )
    rng = np.random.default_rng(7)
    text = [int(t) for t in rng.integers(100, n_vocab, n_prompt)]
    if engine.info.add_bos:
        text[0] = engine.info.bos_token_id
    with_image = text[:16] + items + text[16 : n_prompt - len(items)]
    return {
        "context": ns.context,
        "rows_per_image": len(items),
        "encode_ms": encode_ms,
        "text": _turn(engine, text, ns.gen),
        "image": _turn(engine, with_image, ns.gen),
    }
