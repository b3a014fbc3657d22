"""MTP drafts (`--spec-type draft-mtp`): the model's own nextn layer proposes the next tokens.

The contract with llama.cpp (docs/architecture.md, "MTP drafts"): the draft context is a
second context on the same `llama_model` (loaded with `load_mtp`), of type
LLAMA_CONTEXT_TYPE_MTP; llama.cpp gives it a plain attention KV cache holding only the
nextn layer (in `--spec-kv-dtype`), and its graph runs only that layer. A row at position
p takes the token x_p and the trunk's hidden state h_{p-1} (its `h_nextn`, read from the
target with `llama_get_embeddings_nextn_ith` after `llama_set_embeddings_nextn(tgt, true,
unmasked)`), both in one llama_batch (token and embd set); its logits predict x_{p+1} and
its own `h_nextn` feeds the next draft row.

Following the target (this object is the target context's MainSeqObserver):
- every decode of the main sequence is mirrored at the same positions (catch-up): the
  draft context's cells from the batch's first position on are dropped first, so draft
  rows of the last step never linger and positions always grow (M-RoPE batches need it);
- every `seq_rm` of the main sequence (window eviction, spill, truncation, rejected draft
  cells) and `seq_add` (block moves) is applied to the draft context too;
- blocks the window restores from the host store are NOT restored here: the host store
  keeps the trunk's attention layers only, and the nextn layer's K/V for those tokens
  would need their hidden states again. The draft context therefore holds the nextn K/V of
  the tokens it saw that are still in the target's window; restored blocks are missing from
  it. That costs draft quality only: every draft is verified by the target, so the output
  never depends on the draft context's contents.
The draft context's cells never enter the host store (it is never harvested).
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import llama_cpp
import numpy as np
from llama_cpp import llama_cpp_ext

from kvmem.errors import ConfigError, DecodeError
from kvmem.memory.ggml_types import GgmlType

from .batch_rows import MAIN_SEQ
from .context import ContextSettings, LlamaContext
from .model import LlamaModel

logger = logging.getLogger(__name__)

_H_KEEP = 64  # hidden states of the newest positions kept (a tail cut needs h_{p0-1})


@dataclass(slots=True)
class _Pending:
    """A decode of the target not yet mirrored: its tokens and their h_{p-1} rows."""

    tokens: list[int]
    start_pos: int
    rows: np.ndarray  # [len(tokens), n_embd]

    def cut(self, pos: int) -> None:
        """Keep the rows before position `pos`."""
        keep = max(0, pos - self.start_pos)
        self.tokens = self.tokens[:keep]
        self.rows = self.rows[:keep]


class MtpDrafter:
    """The draft context and the trunk's hidden states it pairs with the tokens."""

    def __init__(
        self, target: LlamaContext, kv_type: GgmlType, n_max: int, n_threads: int | None = None
    ) -> None:
        model: LlamaModel = target.model
        if model.n_layer_nextn < 1:
            raise ConfigError("--spec-type", "draft-mtp needs a model with an MTP (nextn) layer")
        t = target.settings
        settings = ContextSettings(
            n_cells=t.n_cells + n_max + 2,  # the window's cells plus one step's draft rows
            n_batch=t.n_batch,
            n_ubatch=t.n_ubatch,
            n_threads=n_threads or t.n_threads,
            n_threads_batch=t.n_threads_batch,
            flash_attn=t.flash_attn,
            type_k=kv_type,
            type_v=kv_type,
            offload_kqv=t.offload_kqv,
            draft_mtp=True,
        )
        self.ctx = LlamaContext(model, settings)
        self.target = target
        self.n_embd = llama_cpp.llama_model_n_embd(model.ptr)
        self.n_max = n_max
        n = self.ctx.n_batch
        self._embd = np.zeros((n, self.n_embd), dtype=np.float32)  # [n_batch, n_embd]
        self._raw = self.ctx._batch.raw
        self._raw.embd = self._embd.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        self._h: dict[int, np.ndarray] = {}  # position -> trunk h_nextn [n_embd]
        self._pending: _Pending | None = None  # a step's rows, mirrored at the next draft
        self.last_pos = -1  # the newest position decoded on the target
        self.n_drafted_steps = 0
        llama_cpp_ext.llama_set_embeddings_nextn(target.ptr, True, False)  # every row
        llama_cpp_ext.llama_set_embeddings_nextn(self.ctx.ptr, True, True)  # output rows
        target.observer = self

    # following the target ------------------------------------------------------------
    def after_decode(self, ctx: LlamaContext, tokens: Sequence[int], start_pos: int) -> None:
        n = len(tokens)
        ptr = llama_cpp_ext.llama_get_embeddings_nextn(ctx.ptr)
        if not ptr:
            raise DecodeError("the target context gave no nextn hidden states")
        h = np.ctypeslib.as_array(ptr, shape=(n, self.n_embd))  # [n, n_embd], a view
        self.flush()
        # the rows pair x_p with h_{p-1}: the batch's first token with the row kept from
        # before (a zero row when there is none), the others with the batch's own rows
        prev = self._h.get(start_pos - 1)
        if n > self.n_max + 1:  # a prefill chunk: mirrored now, straight from the target
            self._embd[0] = prev if prev is not None else 0.0
            self._embd[1:n] = h[: n - 1]
            self._decode(tokens, start_pos, [False] * n)
        else:  # a step's batch waits for the next draft (its rejected rows are cut first)
            rows = np.empty((n, self.n_embd), dtype=np.float32)  # [n, n_embd]
            rows[0] = prev if prev is not None else 0.0
            rows[1:] = h[: n - 1]
            self._pending = _Pending(list(tokens), start_pos, rows)
        for i in range(max(0, n - _H_KEEP), n):
            self._h[start_pos + i] = h[i].copy()
        if len(self._h) > 2 * _H_KEEP:
            for pos in sorted(self._h)[: len(self._h) - _H_KEEP]:
                del self._h[pos]
        self.last_pos = start_pos + n - 1

    def after_seq_rm(self, p0: int, p1: int) -> None:
        start = max(p0, 0)
        pending = self._pending
        if pending is not None and p1 < 0:
            pending.cut(start)  # rejected draft rows (or a rewind) never reach the draft KV
            if not pending.tokens:
                self._pending = None
        else:
            self.flush()
        llama_cpp.llama_memory_seq_rm(self.ctx.mem, MAIN_SEQ, p0, p1)
        if p1 < 0:  # a tail cut (or all): the newest position is p0 - 1
            for pos in [p for p in self._h if p >= start]:
                del self._h[pos]
            self.last_pos = start - 1
        else:
            for pos in range(start, p1):
                self._h.pop(pos, None)

    def after_seq_add(self, p0: int, p1: int, delta: int) -> None:
        self.flush()
        llama_cpp.llama_memory_seq_add(self.ctx.mem, MAIN_SEQ, p0, p1, delta)

    def flush(self, extra: tuple[int, np.ndarray] | None = None) -> None:
        """Decode the mirrored rows not yet in the draft context; `extra` (token, h row)
        is appended as one more row with logits (the first draft row)."""
        pending, self._pending = self._pending, None
        if pending is None and extra is None:
            return
        tokens = pending.tokens if pending is not None else []
        start = pending.start_pos if pending is not None else self.last_pos + 1
        n = len(tokens) + (extra is not None)
        if pending is not None:
            self._embd[: len(tokens)] = pending.rows
        if extra is not None:
            tokens = [*tokens, extra[0]]
            self._embd[n - 1] = extra[1]
        self._decode(tokens, start, [False] * (n - 1) + [extra is not None])

    # drafting --------------------------------------------------------------------------
    def __call__(self, history: np.ndarray, n: int) -> list[int]:
        """Up to n tokens after history[-1] (sampled, not yet decoded, at position
        len(history) - 1): greedy over the MTP head's logits, one row per token."""
        pos = len(history) - 1
        h = self._h.get(pos - 1)
        if n <= 0 or h is None or self.last_pos != pos - 1:
            return []
        token = int(history[-1])
        draft: list[int] = []
        self.flush((token, h))  # the step's mirrored rows and the first draft row, one batch
        for i in range(n):
            if i > 0:
                self._decode([token], pos + i, [True])
            logits = np.ctypeslib.as_array(
                llama_cpp.llama_get_logits_ith(self.ctx.ptr, -1), shape=(self.ctx.n_vocab,)
            )
            token = int(np.argmax(logits))
            draft.append(token)
            if i + 1 < n:
                row = llama_cpp_ext.llama_get_embeddings_nextn_ith(self.ctx.ptr, -1)
                self._embd[0] = np.ctypeslib.as_array(row, shape=(self.n_embd,))
        self.n_drafted_steps += 1
        return draft

    def _decode(self, tokens: Sequence[int], start_pos: int, logits: Sequence[bool]) -> None:
        # drop the draft context's cells from start_pos on (last step's draft rows, or a
        # re-decode after a rewind): positions then only grow
        llama_cpp.llama_memory_seq_rm(self.ctx.mem, MAIN_SEQ, start_pos, -1)
        self.ctx._batch.fill(tokens, start_pos, logits)
        rc = llama_cpp.llama_decode(self.ctx.ptr, self._raw)
        if rc != 0:
            raise DecodeError(f"MTP draft decode failed with code {rc} at position {start_pos}")

    def close(self) -> None:
        if self.target.observer is self:
            self.target.observer = None
        if self.ctx.ptr:
            self._raw.embd = None  # the batch does not own this buffer
            self.ctx.close()
