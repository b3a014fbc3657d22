"""Random-weight GGUF models of any Llama shape (or a Qwen3.5 hybrid, see synth_hybrid),
for mechanics and speed benchmarks.

The file is written streaming: tensor infos first, then each tensor in row chunks that
worker threads generate and quantize in parallel while the main thread writes them in
order, so an 8B shape (~8.5 GB of Q8_0) never sits in memory twice. Every chunk has its
own RNG stream keyed by (seed, tensor, chunk), so the bytes do not depend on the number
of threads.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import BinaryIO, Protocol

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, LlamaFileType
from gguf.quants import quantize

from kvmem.bench.gguf_tokenizer import default_tokenizer_gguf, read_tokenizer
from kvmem.errors import ConfigError

logger = logging.getLogger(__name__)

CHUNK_ELEMENTS = 1 << 22  # about 4M weights (16 MB of float32) per generated chunk


class Arch(Enum):
    LLAMA = "llama"
    QWEN35 = "qwen35"  # gated-delta-net hybrid (bench/synth_hybrid.py)


class WeightType(Enum):
    """Storage type of the 2-D weight matrices (norms are always f32)."""

    F32 = "f32"
    F16 = "f16"
    Q8_0 = "q8_0"

    @property
    def ggml(self) -> GGMLQuantizationType:
        return _GGML_TYPE[self]

    @property
    def file_type(self) -> LlamaFileType:
        return _FILE_TYPE[self]

    def row_bytes(self, n_cols: int) -> int:
        if self is WeightType.Q8_0:
            return n_cols // 32 * 34
        return n_cols * (4 if self is WeightType.F32 else 2)


_GGML_TYPE = {
    WeightType.F32: GGMLQuantizationType.F32,
    WeightType.F16: GGMLQuantizationType.F16,
    WeightType.Q8_0: GGMLQuantizationType.Q8_0,
}
_FILE_TYPE = {
    WeightType.F32: LlamaFileType.ALL_F32,
    WeightType.F16: LlamaFileType.MOSTLY_F16,
    WeightType.Q8_0: LlamaFileType.MOSTLY_Q8_0,
}


@dataclass(frozen=True, slots=True)
class ModelShape:
    """Hyperparameters of a Llama-architecture model. The defaults are the Llama-3 8B shape."""

    arch: Arch = Arch.LLAMA
    n_layer: int = 36
    n_embd: int = 4096
    n_head: int = 32
    n_head_kv: int = 8
    n_ff: int = 14336
    n_ctx_train: int = 262144
    rope_base: float = 500000.0
    rms_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def validate(self) -> None:
        for flag, value in (
            ("--n-layer", self.n_layer),
            ("--n-embd", self.n_embd),
            ("--n-head", self.n_head),
            ("--n-head-kv", self.n_head_kv),
            ("--n-ff", self.n_ff),
            ("--n-ctx-train", self.n_ctx_train),
        ):
            if value <= 0:
                raise ConfigError(flag, f"must be a positive number, got {value}")
        if self.n_embd % self.n_head:
            raise ConfigError("--n-head", f"{self.n_head} does not divide n_embd {self.n_embd}")
        if self.n_head % self.n_head_kv:
            raise ConfigError(
                "--n-head-kv", f"{self.n_head_kv} does not divide n_head {self.n_head}"
            )
        if self.n_embd % 32 or self.n_ff % 32:
            raise ConfigError("--n-embd/--n-ff", "must be multiples of 32 (the Q8_0 block size)")
        if self.rope_base <= 0:
            raise ConfigError("--rope-base", f"must be positive, got {self.rope_base}")

    def tensors(self, n_vocab: int) -> list[TensorSpec]:
        return _llama_tensors(self, n_vocab)

    def add_hparams(self, writer: GGUFWriter) -> None:
        writer.add_context_length(self.n_ctx_train)
        writer.add_embedding_length(self.n_embd)
        writer.add_block_count(self.n_layer)
        writer.add_feed_forward_length(self.n_ff)
        writer.add_head_count(self.n_head)
        writer.add_head_count_kv(self.n_head_kv)
        writer.add_rope_dimension_count(self.head_dim)
        writer.add_rope_freq_base(self.rope_base)
        writer.add_layer_norm_rms_eps(self.rms_eps)

    def describe(self, n_vocab: int) -> str:
        return (
            f"{self.arch.value}: {self.n_layer} layers, n_embd {self.n_embd}, heads "
            f"{self.n_head}/{self.n_head_kv} (head_dim {self.head_dim}), n_ff {self.n_ff}, "
            f"n_vocab {n_vocab}, n_ctx_train {self.n_ctx_train}, rope base {self.rope_base:g}"
        )


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One tensor to write: numpy shape [rows, cols] (cols = ggml ne0, the input dim).

    `is_norm`: a 1-D f32 tensor of `cols` elements, every one equal to `value` (norm weights
    are 1). `f32`: a random matrix kept in f32 whatever the weight type (a conv kernel whose
    rows are too short to quantize)."""

    name: str
    rows: int
    cols: int
    is_norm: bool
    value: float = 1.0
    f32: bool = False

    def stored(self, weights: WeightType) -> WeightType:
        return WeightType.F32 if self.is_norm or self.f32 else weights


class SynthShape(Protocol):
    """What the writer needs from a model shape (ModelShape here, Qwen35Shape in synth_hybrid)."""

    @property
    def arch(self) -> Arch: ...

    @property
    def n_layer(self) -> int: ...

    @property
    def n_embd(self) -> int: ...

    def validate(self) -> None: ...

    def tensors(self, n_vocab: int) -> list[TensorSpec]: ...

    def add_hparams(self, writer: GGUFWriter) -> None: ...

    def describe(self, n_vocab: int) -> str: ...


@dataclass(slots=True)
class SynthResult:
    path: Path
    n_vocab: int
    n_tensors: int
    n_bytes: int
    seconds: float


def tensor_specs(shape: SynthShape, n_vocab: int) -> list[TensorSpec]:
    """The tensors of a model of `shape`, in llama.cpp's naming and in file order."""
    return shape.tensors(n_vocab)


def _llama_tensors(shape: ModelShape, n_vocab: int) -> list[TensorSpec]:
    """The tensors of a Llama model, in llama.cpp's naming."""
    q_dim = shape.n_head * shape.head_dim
    kv_dim = shape.n_head_kv * shape.head_dim
    specs = [TensorSpec("token_embd.weight", n_vocab, shape.n_embd, False)]
    for i in range(shape.n_layer):
        specs += [
            TensorSpec(f"blk.{i}.attn_norm.weight", 1, shape.n_embd, True),
            TensorSpec(f"blk.{i}.attn_q.weight", q_dim, shape.n_embd, False),
            TensorSpec(f"blk.{i}.attn_k.weight", kv_dim, shape.n_embd, False),
            TensorSpec(f"blk.{i}.attn_v.weight", kv_dim, shape.n_embd, False),
            TensorSpec(f"blk.{i}.attn_output.weight", shape.n_embd, q_dim, False),
            TensorSpec(f"blk.{i}.ffn_norm.weight", 1, shape.n_embd, True),
            TensorSpec(f"blk.{i}.ffn_gate.weight", shape.n_ff, shape.n_embd, False),
            TensorSpec(f"blk.{i}.ffn_up.weight", shape.n_ff, shape.n_embd, False),
            TensorSpec(f"blk.{i}.ffn_down.weight", shape.n_embd, shape.n_ff, False),
        ]
    specs += [
        TensorSpec("output_norm.weight", 1, shape.n_embd, True),
        TensorSpec("output.weight", n_vocab, shape.n_embd, False),
    ]
    return specs


def write_synthetic_model(
    path: Path | str,
    shape: SynthShape = ModelShape(),
    weights: WeightType = WeightType.Q8_0,
    seed: int = 0,
    tokenizer_gguf: Path | str | None = None,
    threads: int | None = None,
    distinct_chunks: int = 0,
) -> SynthResult:
    """Write a random-weight GGUF model with the tokenizer of `tokenizer_gguf`.

    `distinct_chunks` > 0 generates only that many chunks per chunk shape and repeats them
    (keyed by chunk index modulo the count, not by tensor): the weights are still random
    where it matters for speed runs, and writing becomes bound by the disk, not the RNG.
    """
    shape.validate()
    started = time.perf_counter()
    out = Path(path)
    source = Path(tokenizer_gguf) if tokenizer_gguf is not None else default_tokenizer_gguf()
    tokenizer = read_tokenizer(source)
    n_vocab = tokenizer.n_vocab
    specs = tensor_specs(shape, n_vocab)

    writer = GGUFWriter(out, shape.arch.value)
    _add_hparams(writer, shape, weights, n_vocab)
    tokenizer.write_to(writer)
    for spec in specs:
        stored = spec.stored(weights)
        writer.add_tensor_info(
            spec.name,
            (spec.rows, spec.cols) if not spec.is_norm else (spec.cols,),
            np.dtype(np.float32),
            spec.rows * stored.row_bytes(spec.cols),
            raw_dtype=stored.ggml,
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    assert writer.fout is not None and len(writer.fout) == 1
    fout = writer.fout[0]
    workers = threads or os.cpu_count() or 1
    n_bytes = 0
    source_chunks = _ChunkSource(weights, seed, distinct_chunks)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for index, spec in enumerate(specs):
            writer.write_padding(fout, fout.tell())
            stored = spec.stored(weights)
            written = _write_tensor(fout, pool, workers, spec, stored, source_chunks, index)
            writer.write_padding(fout, written)
            n_bytes += written
    writer.close()
    seconds = time.perf_counter() - started
    logger.info("wrote %s: %d tensors, %.2f GB in %.1f s", out, len(specs), n_bytes / 1e9, seconds)
    return SynthResult(
        path=out, n_vocab=n_vocab, n_tensors=len(specs), n_bytes=n_bytes, seconds=seconds
    )


def _add_hparams(writer: GGUFWriter, shape: SynthShape, weights: WeightType, n_vocab: int) -> None:
    writer.add_name(f"kvmem-synthetic-{shape.arch.value}-{shape.n_layer}L-{shape.n_embd}")
    writer.add_file_type(int(weights.file_type))
    writer.add_quantization_version(2)
    writer.add_vocab_size(n_vocab)
    shape.add_hparams(writer)


def _write_tensor(
    fout: BinaryIO,
    pool: ThreadPoolExecutor,
    workers: int,
    spec: TensorSpec,
    stored: WeightType,
    chunks: _ChunkSource,
    index: int,
) -> int:
    """Generate, convert and write one tensor chunk by chunk; returns its byte count."""
    if spec.is_norm:
        const = np.full(spec.cols, spec.value, dtype=np.float32)  # [cols]
        fout.write(const.tobytes())
        return const.nbytes
    rows_per_chunk = max(1, CHUNK_ELEMENTS // spec.cols)
    std = float(1.0 / np.sqrt(spec.cols))
    pending: deque[Future[np.ndarray]] = deque()
    written = 0
    for chunk, row0 in enumerate(range(0, spec.rows, rows_per_chunk)):
        n_rows = min(rows_per_chunk, spec.rows - row0)
        pending.append(pool.submit(chunks.get, n_rows, spec.cols, std, stored, index, chunk))
        if len(pending) >= 2 * workers:
            written += _drain_one(fout, pending)
    while pending:
        written += _drain_one(fout, pending)
    return written


def _drain_one(fout: BinaryIO, pending: deque[Future[np.ndarray]]) -> int:
    data = pending.popleft().result()
    fout.write(memoryview(data).cast("B"))
    return data.nbytes


class _ChunkSource:
    """Generates chunks, or with `distinct` > 0 serves a bounded set of them repeatedly."""

    def __init__(self, weights: WeightType, seed: int, distinct: int) -> None:
        self.weights = weights
        self.seed = seed
        self.distinct = distinct
        self._cache: dict[tuple[int, int, int, WeightType], Future[np.ndarray]] = {}
        self._lock = threading.Lock()

    def get(
        self, n_rows: int, n_cols: int, std: float, stored: WeightType, tensor: int, chunk: int
    ) -> np.ndarray:
        if self.distinct <= 0:
            return _make_chunk(n_rows, n_cols, std, stored, self.seed, tensor, chunk)
        key = (n_rows, n_cols, chunk % self.distinct, stored)
        with self._lock:
            future = self._cache.get(key)
            owner = future is None
            if owner:
                future = self._cache[key] = Future()
        assert future is not None
        if owner:
            future.set_result(
                _make_chunk(n_rows, n_cols, std, stored, self.seed, -1 - n_cols, key[2])
            )
        return future.result()


def _make_chunk(
    n_rows: int,
    n_cols: int,
    std: float,
    weights: WeightType,
    seed: int,
    tensor_index: int,
    chunk_index: int,
) -> np.ndarray:
    rng = np.random.default_rng([seed, tensor_index & 0xFFFFFFFF, chunk_index])
    values = rng.standard_normal((n_rows, n_cols), dtype=np.float32)  # [n_rows, n_cols]
    values *= np.float32(std)
    stored = quantize(values, weights.ggml)  # [n_rows, row_bytes] uint8 or [n_rows, n_cols] float
    return np.ascontiguousarray(stored)


def iter_shapes_summary(shape: SynthShape, n_vocab: int, weights: WeightType) -> Iterator[str]:
    """Human-readable lines describing the model to be written (for the CLI)."""
    specs = tensor_specs(shape, n_vocab)
    total = sum(s.rows * s.stored(weights).row_bytes(s.cols) for s in specs)
    n_params = sum(s.rows * s.cols for s in specs)
    yield shape.describe(n_vocab)
    yield f"{len(specs)} tensors, {n_params / 1e9:.2f} B parameters, {total / 1e9:.2f} GB as {weights.value}"
