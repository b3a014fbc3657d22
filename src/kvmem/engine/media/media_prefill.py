"""Decoding a token run that holds image stand-ins: text runs go through the context's
token batch, stand-in runs through an embedding batch of their rows, at the same positions,
in order. The caller sees one decode: the logits of the last row are the last batch's."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import groupby

import llama_cpp
import numpy as np

from kvmem.errors import DecodeError

from ..llama.batch_rows import fill_rows
from .media import VisionProjector, is_standin


class EmbdBatch:
    """A reusable llama_batch carrying embedding rows instead of token ids."""

    def __init__(self, capacity: int, n_embd: int) -> None:
        self.capacity, self.n_embd = capacity, n_embd
        self.raw = llama_cpp.llama_batch_init(capacity, n_embd, 1)

    def fill(self, rows: np.ndarray, start_pos: int, logits: Sequence[bool]) -> None:
        n = len(rows)
        assert 0 < n <= self.capacity and rows.shape[1] == self.n_embd
        raw = self.raw
        flat = np.ascontiguousarray(rows, dtype=np.float32).ravel()  # [n * n_embd]
        dst = np.ctypeslib.as_array(raw.embd, shape=(self.capacity * self.n_embd,))
        dst[: flat.size] = flat
        fill_rows(raw, n, start_pos, logits)

    def free(self) -> None:
        if self.raw is not None:
            llama_cpp.llama_batch_free(self.raw)
            self.raw = None


def has_standins(tokens: Sequence[int]) -> bool:
    return any(is_standin(t) for t in tokens)


def decode_mixed(ctx, tokens: Sequence[int], start_pos: int, logits: Sequence[bool]) -> None:
    """Decode `tokens` (text ids and stand-ins) at start_pos.. on the main sequence of the
    LlamaContext `ctx`, whose `vision` projector answers the stand-ins."""
    projector: VisionProjector | None = ctx.vision
    if projector is None:
        raise DecodeError("image rows in a prompt without a vision projector")
    if ctx.embd_batch is None:
        ctx.embd_batch = EmbdBatch(ctx.n_batch, projector.n_embd)
    i = 0
    for image, run in groupby(tokens, key=is_standin):
        part = list(run)
        flags = logits[i : i + len(part)]
        if image:
            rows = np.stack([projector.row(t) for t in part])  # [n, n_embd]
            ctx.embd_batch.fill(rows, start_pos + i, flags)
            rc = llama_cpp.llama_decode(ctx.ptr, ctx.embd_batch.raw)
        else:
            ctx._batch.fill(part, start_pos + i, flags)
            rc = llama_cpp.llama_decode(ctx.ptr, ctx._batch.raw)
        if rc != 0:
            raise DecodeError(f"llama_decode failed with code {rc} at position {start_pos + i}")
        i += len(part)
