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
- every decode of the main sequence is mirrored at the same positions. A prefill chunk is
  decoded into the draft context at once; a step's rows only go into the backlog
  (memory.draft_mirror.DraftBacklog: a row copy, no decode), and the next draft decodes
  the backlog and its first draft row in one batch (catch-up). So a step the draft gate
  keeps plain costs what a plain step costs, and rejected draft rows, cut from the backlog
  by the verifier's `seq_rm`, never reach the draft KV. The backlog is bounded
  (BACKLOG_ROWS); when it would overflow, its rows are dropped and the draft context
  continues after a gap. Each decode first drops the draft context's cells from its first
  position on, so positions always grow (M-RoPE batches need it);
- every `seq_rm` of the main sequence (window eviction, spill, truncation, rejected draft
  cells) and `seq_add` (block moves) is applied to the draft context and the backlog;
- the draft KV follows the window (mtp_blocks.MtpBlocks): when the target harvests a
  block, the drafter copies that block's nextn K/V from the draft context to a host copy
  of its own (after the next catch-up if the block's rows are still in the backlog); when
  the target restores blocks, the same blocks are restored into the draft context at the
  same positions.
The draft context's cells never enter the target's host store. Gaps (a dropped backlog, a
block without a copy) cost draft quality only: every draft is verified by the target.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Mapping, Sequence

import llama_cpp
import numpy as np
from llama_cpp import llama_cpp_ext

from kvmem.errors import ConfigError, DecodeError
from kvmem.memory.draft_mirror import DraftBacklog, PositionSet
from kvmem.memory.ggml_types import GgmlType

from ..llama.batch_rows import MAIN_SEQ
from ..llama.context import ContextSettings, LlamaContext
from ..llama.model import LlamaModel
from .draft_gate import PROBE_MAX
from .mtp_blocks import MtpBlocks

logger = logging.getLogger(__name__)

_H_KEEP = 64  # hidden states of the newest positions kept (a tail cut needs h_{p0-1})
BACKLOG_ROWS = PROBE_MAX  # rows of plain steps held: the longest gap between two probes


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
        # the trunk's h_nextn of the newest positions, slot = position % _H_KEEP
        self._h_rows = np.zeros((_H_KEEP, self.n_embd), dtype=np.float32)  # [_H_KEEP, n_embd]
        self._h_pos = np.full(_H_KEEP, -1, dtype=np.int64)  # [_H_KEEP] position of each slot
        self._step_h = np.zeros((n_max + 1, self.n_embd), dtype=np.float32)  # [n_max+1, n_embd]
        self._step_h_addr = self._step_h.ctypes.data
        self._step_rows = np.zeros_like(self._step_h)  # [n_max + 1, n_embd]
        self.backlog = DraftBacklog(BACKLOG_ROWS)  # steps' rows, mirrored at the next draft
        self.mirrored = PositionSet()  # positions whose cells hold the target's rows
        self.blocks = MtpBlocks(self.ctx, self.mirrored)
        self.last_pos = -1  # the newest position decoded on the target
        self.n_drafted_steps = 0
        self.n_decodes = 0  # llama_decode calls on the draft context
        llama_cpp_ext.llama_set_embeddings_nextn(target.ptr, True, False)  # every row
        llama_cpp_ext.llama_set_embeddings_nextn(self.ctx.ptr, True, True)  # output rows
        target.observer = self

    # following the target ------------------------------------------------------------
    def after_decode(self, ctx: LlamaContext, tokens: Sequence[int], start_pos: int) -> None:
        n = len(tokens)
        ptr = llama_cpp_ext.llama_get_embeddings_nextn(ctx.ptr)
        if not ptr:
            raise DecodeError("the target context gave no nextn hidden states")
        # the rows pair x_p with h_{p-1}: the batch's first token with the row kept from
        # before (a zero row when there is none), the others with the batch's own rows
        prev = self._h_row(start_pos - 1)
        if n > self.n_max + 1:  # a prefill chunk: mirrored now, straight from the target
            h = np.ctypeslib.as_array(ptr, shape=(n, self.n_embd))  # [n, n_embd], a view
            self.catch_up()
            self._embd[0] = prev if prev is not None else 0.0
            self._embd[1:n] = h[: n - 1]
            self._decode(tokens, start_pos, n_mirrored=n, logits=False)
        else:  # a step's batch waits in the backlog (its rejected rows are cut first)
            h = self._step_h[:n]  # [n, n_embd]: a copy of the target's rows
            ctypes.memmove(self._step_h_addr, ptr, h.nbytes)
            rows = self._step_rows[:n]  # [n, n_embd]
            rows[0] = prev if prev is not None else 0.0
            rows[1:] = h[: n - 1]
            self.backlog.add(tokens, start_pos, rows)
        self._keep_h(h, start_pos)
        self.last_pos = start_pos + n - 1

    def _h_row(self, pos: int) -> np.ndarray | None:
        """The trunk's h_nextn of position `pos` when kept: [n_embd], a view."""
        slot = pos % _H_KEEP
        return self._h_rows[slot] if pos >= 0 and self._h_pos[slot] == pos else None

    def _keep_h(self, h: np.ndarray, start_pos: int) -> None:
        """Keep the newest rows of h (float32 [n, n_embd], positions start_pos ..)."""
        n = len(h)
        if n == 1:
            slot = start_pos % _H_KEEP
            self._h_rows[slot] = h[0]
            self._h_pos[slot] = start_pos
            return
        pos = np.arange(max(start_pos, start_pos + n - _H_KEEP), start_pos + n)  # [n_kept]
        self._h_rows[pos % _H_KEEP] = h[pos - start_pos]
        self._h_pos[pos % _H_KEEP] = pos

    def after_seq_rm(self, p0: int, p1: int) -> None:
        start = max(p0, 0)
        if p1 < 0:  # a tail cut (or all): rejected draft rows, a rewind, a truncation
            self.backlog.cut(start)
            self.blocks.drop_from(p0)
        else:
            self.backlog.remove(start, p1)
        self.mirrored.discard(start, p1)
        llama_cpp.llama_memory_seq_rm(self.ctx.mem, MAIN_SEQ, p0, p1)
        kept = self._h_pos  # [_H_KEEP]
        kept[(kept >= start) & ((kept < p1) | (p1 < 0))] = -1
        if p1 < 0:  # the newest position is p0 - 1
            self.last_pos = start - 1

    def after_seq_add(self, p0: int, p1: int, delta: int) -> None:
        self.backlog.shift(p0, p1, delta)
        self.mirrored.shift(p0, p1, delta)
        llama_cpp.llama_memory_seq_add(self.ctx.mem, MAIN_SEQ, p0, p1, delta)

    def after_harvest(self, block_ids: Sequence[int], block_tokens: int) -> None:
        first = self.backlog.first_pos
        self.blocks.harvest(block_ids, block_tokens, self.last_pos + 1 if first is None else first)

    def after_restore(self, starts: Mapping[int, int], block_tokens: int) -> None:
        first = self.backlog.first_pos
        if first is not None and first < max(starts.values()) + block_tokens:
            self.catch_up()  # a catch-up from below the blocks would remove them again
        self.blocks.restore(starts, block_tokens)

    def catch_up(self, first_draft: tuple[int, int, np.ndarray] | None = None) -> None:
        """Decode the backlog into the draft context, in batches of consecutive positions;
        `first_draft` (position, token, h row) is one more row, with logits, in the last
        batch when it continues it."""
        cap = self.ctx.n_batch
        for run in self.backlog.take(cap):
            n = len(run.tokens)
            self._embd[:n] = run.rows
            tokens = run.tokens
            joined = first_draft is not None and first_draft[0] == run.end_pos and n < cap
            if joined:
                assert first_draft is not None
                tokens = [*tokens, first_draft[1]]
                self._embd[n] = first_draft[2]
                first_draft = None
            self._decode(tokens, run.start_pos, n_mirrored=len(tokens), logits=joined)
        if first_draft is not None:
            pos, token, h = first_draft
            self._embd[0] = h
            self._decode([token], pos, n_mirrored=1, logits=True)
        self.blocks.harvest_deferred()

    # drafting --------------------------------------------------------------------------
    def __call__(self, history: np.ndarray, n: int) -> list[int]:
        """Up to n tokens after history[-1] (sampled, not yet decoded, at position
        len(history) - 1): greedy over the MTP head's logits, one row per token."""
        pos = len(history) - 1
        h = self._h_row(pos - 1)
        if n <= 0 or h is None or self.last_pos != pos - 1:
            return []
        token = int(history[-1])
        draft: list[int] = []
        self.catch_up((pos, token, h))  # the backlog and the first draft row, one batch
        for i in range(n):
            if i > 0:
                self._decode([token], pos + i, n_mirrored=0, logits=True)
            logits = np.ctypeslib.as_array(
                llama_cpp.llama_get_logits_ith(self.ctx.ptr, -1), shape=(self.ctx.n_vocab,)
            )
            token = int(np.argmax(logits))
            draft.append(token)
            if i + 1 < n:
                row = llama_cpp_ext.llama_get_embeddings_nextn_ith(self.ctx.ptr, -1)
                self._embd[0] = np.ctypeslib.as_array(row, shape=(self.n_embd,))
        # the draft rows (the head's own hidden states) leave: the cells hold target rows
        llama_cpp.llama_memory_seq_rm(self.ctx.mem, MAIN_SEQ, pos + 1, -1)
        self.n_drafted_steps += 1
        return draft

    def _decode(
        self, tokens: Sequence[int], start_pos: int, *, n_mirrored: int, logits: bool
    ) -> None:
        """Decode at start_pos .. (logits for the last row when `logits`); the first
        `n_mirrored` rows are the target's (token and trunk hidden state)."""
        # drop the draft context's cells from start_pos on (a re-decode after a rewind, a
        # draft row): positions then only grow
        llama_cpp.llama_memory_seq_rm(self.ctx.mem, MAIN_SEQ, start_pos, -1)
        self.mirrored.discard(start_pos, -1)
        n = len(tokens)
        self.ctx._batch.fill(tokens, start_pos, [False] * (n - 1) + [logits])
        rc = llama_cpp.llama_decode(self.ctx.ptr, self._raw)
        self.n_decodes += 1
        if rc != 0:
            raise DecodeError(f"MTP draft decode failed with code {rc} at position {start_pos}")
        self.mirrored.add(start_pos, start_pos + n_mirrored)

    def close(self) -> None:
        if self.target.observer is self:
            self.target.observer = None
        if self.ctx.ptr:
            self.blocks.close()
            self._raw.embd = None  # the batch does not own this buffer
            self.ctx.close()
