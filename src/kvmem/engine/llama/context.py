"""An owned llama.cpp context: decoding at explicit positions and the memory calls KVMem uses."""

from __future__ import annotations

import ctypes
import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import llama_cpp
import numpy as np

from kvmem.errors import DecodeError, KVTransferError, ModelLoadError
from kvmem.memory.ggml_types import GgmlType
from kvmem.memory.kv_cells import KVCells

from ..media.media_prefill import decode_mixed, has_standins
from .batch_rows import MAIN_SEQ, N_SEQ, fill_rows
from .host_staging import StagingBuffer
from .model import LlamaModel

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ContextSettings:
    n_cells: int  # KV cells of the context (llama n_ctx)
    n_batch: int = 2048
    n_ubatch: int = 512
    n_threads: int | None = None
    n_threads_batch: int | None = None
    flash_attn: bool = True
    type_k: GgmlType = GgmlType.F16
    type_v: GgmlType = GgmlType.F16
    offload_kqv: bool = True
    # recurrent-state rollback planes per sequence (hybrid models): seq_rm may then drop up
    # to n_rs_seq tokens from the tail (speculative verification); 0 = no rollback
    n_rs_seq: int = 0
    draft_mtp: bool = False  # an MTP draft context: runs only the model's nextn layer
    n_seq_max: int = N_SEQ  # sequence ids (KVMem: main + 2 staging; the seq-id baseline: N)


class MainSeqObserver(Protocol):
    """Told of every change to the main sequence made through this context (the MTP
    drafter's draft context follows it: mtp_draft.py), and of the blocks KVTransfer
    harvests from it and restores into it (block id -> first position of its cells)."""

    def after_decode(self, ctx: LlamaContext, tokens: Sequence[int], start_pos: int) -> None: ...

    def after_seq_rm(self, p0: int, p1: int) -> None: ...

    def after_seq_add(self, p0: int, p1: int, delta: int) -> None: ...

    def after_harvest(self, block_ids: Sequence[int], block_tokens: int) -> None: ...

    def after_restore(self, starts: Mapping[int, int], block_tokens: int) -> None: ...


class Batch:
    """A reusable llama_batch for one sequence."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.raw = llama_cpp.llama_batch_init(capacity, 0, 1)

    def fill(
        self, tokens: Sequence[int], start_pos: int, logits: Sequence[bool], seq: int = MAIN_SEQ
    ) -> None:
        n = len(tokens)
        assert 0 < n <= self.capacity
        raw = self.raw
        for i, tok in enumerate(tokens):
            raw.token[i] = tok
        fill_rows(raw, n, start_pos, logits, seq)

    def free(self) -> None:
        if self.raw is not None:
            llama_cpp.llama_batch_free(self.raw)
            self.raw = None


class LlamaContext:
    """`llama_context *` with a unified KV cache and spare sequence ids for staging."""

    def __init__(
        self,
        model: LlamaModel,
        settings: ContextSettings,
        eval_callback=None,
        eval_user_data: int | None = None,
    ) -> None:
        p = llama_cpp.llama_context_default_params()
        p.n_ctx = settings.n_cells
        p.n_batch = settings.n_batch
        p.n_ubatch = min(settings.n_ubatch, settings.n_batch)
        p.n_seq_max = settings.n_seq_max
        threads = settings.n_threads or os.cpu_count() or 1
        p.n_threads = threads
        p.n_threads_batch = settings.n_threads_batch or threads
        p.flash_attn_type = (
            1 if settings.flash_attn else 0
        )  # LLAMA_FLASH_ATTN_TYPE_ENABLED/DISABLED
        p.type_k = int(settings.type_k)
        p.type_v = int(settings.type_v)
        p.kv_unified = True
        p.offload_kqv = settings.offload_kqv
        p.n_rs_seq = settings.n_rs_seq
        if settings.draft_mtp:
            p.ctx_type = llama_cpp.LLAMA_CONTEXT_TYPE_MTP
        p.no_perf = True
        if eval_callback is not None:
            p.cb_eval = eval_callback
            p.cb_eval_user_data = eval_user_data
        self._callback = eval_callback  # keep the ctypes callback alive
        ptr = llama_cpp.llama_init_from_model(model.ptr, p)
        if not ptr:
            raise ModelLoadError("llama.cpp failed to create the context (see its log)")
        self.ptr = ptr
        self.model = model
        self.settings = settings
        self.n_cells = llama_cpp.llama_n_ctx(ptr)
        self.n_batch = llama_cpp.llama_n_batch(ptr)
        self.n_ubatch = llama_cpp.llama_n_ubatch(ptr)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(model.vocab)
        self.mem = llama_cpp.llama_get_memory(ptr)
        self.n_rs_seq = llama_cpp.llama_n_rs_seq(ptr)  # 0 where the model cannot roll back
        self._batch = Batch(self.n_batch)
        self.vision = None  # a media.VisionProjector: decodes image stand-in ids
        self.embd_batch = None  # media_prefill.EmbdBatch, made on the first image
        self.observer: MainSeqObserver | None = None  # mtp_draft.MtpDrafter with draft-mtp
        self.warmup_tokens = 0  # tokens decoded by warm_up (--warmup)
        # the cells, as llama.cpp places them, followed through this class's calls once
        # `track_cells` asks (None: not followed, or not known since an untracked change)
        self.cells: KVCells | None = None
        self._tracking = False

    def track_cells(self) -> None:
        """Follow where llama.cpp puts every cell (memory/kv_cells.py) from now on: known
        at once when the memory is empty, else from its next clear (a no-op when they are
        followed already: the sessions of `--kvmem-conversations` share one context)."""
        if self._tracking:
            return
        self._tracking = True
        empty = all(self.seq_pos_max(s) < 0 for s in range(self.settings.n_seq_max))
        self.cells = KVCells.empty(self.n_cells) if empty else None

    def _cells_unknown(self) -> None:
        self.cells = None

    # decoding --------------------------------------------------------------------------
    def decode(self, tokens: Sequence[int], start_pos: int, logits: Sequence[bool]) -> None:
        """Decode `tokens` at positions start_pos.. on the main sequence."""
        if self.vision is not None and has_standins(tokens):
            self._cells_unknown()  # not followed through image batches
            decode_mixed(self, tokens, start_pos, logits)  # image rows among the tokens
            return
        self._run_batch(tokens, start_pos, logits, MAIN_SEQ)
        if self.observer is not None:
            self.observer.after_decode(self, tokens, start_pos)

    def decode_scratch(self, seq: int, tokens: Sequence[int], start_pos: int) -> None:
        """Decode `tokens` at positions start_pos.. on the staging sequence `seq`, no logits
        and no observer (a block computed again, `engine/session/recompute.py`): they see
        the cells `seq` holds at lower positions."""
        self._run_batch(tokens, start_pos, [False] * len(tokens), seq)

    def _run_batch(
        self, tokens: Sequence[int], start_pos: int, logits: Sequence[bool], seq: int
    ) -> None:
        self._batch.fill(tokens, start_pos, logits, seq)
        rc = llama_cpp.llama_decode(self.ptr, self._batch.raw)
        if rc != 0:
            self._cells_unknown()
            raise DecodeError(f"llama_decode failed with code {rc} at position {start_pos}")
        if self.cells is not None:
            positions = np.arange(start_pos, start_pos + len(tokens), dtype=np.int64)  # [n]
            self.cells.place(positions, self.n_ubatch, seq)

    def warm_up(self) -> None:
        """llama-server's warm-up (common_init_from_params): BOS then EOS (those the
        vocabulary has; token 0 where it has neither) decoded once from position 0, then the
        memory cleared, so the first request finds the weights paged in and the compute
        buffers allocated. Call it before any sequence is restored or used. A no-op for a
        model without a decoder (an encoder-only GGUF, which kvmem cannot serve anyway)."""
        if not llama_cpp.llama_model_has_decoder(self.model.ptr):
            return
        vocab = self.model.vocab
        ends = (llama_cpp.llama_vocab_bos(vocab), llama_cpp.llama_vocab_eos(vocab))
        tokens = [t for t in ends if t != llama_cpp.LLAMA_TOKEN_NULL][: self.n_batch] or [0]
        start = time.perf_counter()
        self.decode(tokens, 0, [i == len(tokens) - 1 for i in range(len(tokens))])
        self.clear()
        llama_cpp.llama_synchronize(self.ptr)
        self.warmup_tokens += len(tokens)
        ms = (time.perf_counter() - start) * 1000
        logger.info("warm-up: %d tokens decoded, memory cleared (%.0f ms)", len(tokens), ms)

    def logits(self, index: int) -> np.ndarray:
        """A copy of the logits of output row `index` (-1 = last)."""
        ptr = llama_cpp.llama_get_logits_ith(self.ptr, index)
        if not ptr:
            raise DecodeError(f"no logits for output {index}")
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()  # [n_vocab]

    # memory ----------------------------------------------------------------------------
    def seq_rm(self, seq: int, p0: int, p1: int) -> None:
        if not llama_cpp.llama_memory_seq_rm(self.mem, seq, p0, p1):
            raise KVTransferError(f"seq_rm({seq}, {p0}, {p1}) failed")
        if self.cells is not None:
            self.cells.remove(p0, p1, seq)
        if seq == MAIN_SEQ and self.observer is not None:
            self.observer.after_seq_rm(p0, p1)

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        """Shift the positions of seq's cells in [p0, p1) by delta (RoPE re-applied lazily)."""
        llama_cpp.llama_memory_seq_add(self.mem, seq, p0, p1, delta)
        if self.cells is not None:
            self.cells.shift(seq, p0, p1, delta)
        if seq == MAIN_SEQ and self.observer is not None:
            self.observer.after_seq_add(p0, p1, delta)

    def blocks_harvested(self, block_ids: Sequence[int], block_tokens: int) -> None:
        """KVTransfer copied these blocks of the main sequence (at their own positions)."""
        if self.observer is not None:
            self.observer.after_harvest(block_ids, block_tokens)

    def blocks_restored(self, starts: Mapping[int, int], block_tokens: int) -> None:
        """KVTransfer wrote these blocks into the main sequence at `starts`."""
        if self.observer is not None:
            self.observer.after_restore(starts, block_tokens)

    @property
    def can_shift(self) -> bool:
        return bool(llama_cpp.llama_memory_can_shift(self.mem))

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        llama_cpp.llama_memory_seq_cp(self.mem, src, dst, p0, p1)
        if self.cells is not None:
            self.cells.copy_seq(src, dst, p0, p1)

    def seq_pos_max(self, seq: int = MAIN_SEQ) -> int:
        return llama_cpp.llama_memory_seq_pos_max(self.mem, seq)

    def clear(self) -> None:
        llama_cpp.llama_memory_clear(self.mem, True)
        if self._tracking:
            self.cells = KVCells.empty(self.n_cells)
        if self.observer is not None:
            self.observer.after_seq_rm(-1, -1)

    def get_state(
        self, seq: int, flags: int = 0, staging: StagingBuffer | None = None
    ) -> memoryview:
        """The sequence's state blob; flags: LLAMA_STATE_SEQ_FLAGS_* (PARTIAL_ONLY = 1: the
        recurrent part of a hybrid memory alone). With `staging`, the blob is read into that
        reused buffer (valid until its next use) when it fits the buffer's limit."""
        size = llama_cpp.llama_state_seq_get_size_ext(self.ptr, seq, flags)
        if staging is not None and size <= staging.limit_bytes:
            buf = staging.view(size)  # [size]
        else:
            buf = np.empty(size, dtype=np.uint8)  # [size]
        n = llama_cpp.llama_state_seq_get_data_ext(self.ptr, _u8_ptr(buf), size, seq, flags)
        if n == 0:
            raise KVTransferError(f"llama_state_seq_get_data({seq}, flags={flags}) failed")
        return memoryview(buf)[:n]

    def set_state(
        self,
        blob: bytes | np.ndarray,
        seq: int,
        flags: int = 0,
        positions: Sequence[np.ndarray] | None = None,
    ) -> None:
        """Write a state blob into `seq`; `positions` (one array a block, in the blob's
        order) are those of its KV cells, for the cells followed (`track_cells`); a blob of
        the recurrent part alone (flags PARTIAL_ONLY) has none."""
        buf = np.frombuffer(blob, dtype=np.uint8)  # [size], no copy
        n = llama_cpp.llama_state_seq_set_data_ext(self.ptr, _u8_ptr(buf), len(buf), seq, flags)
        if n == 0:
            self._cells_unknown()
            raise KVTransferError(
                f"llama_state_seq_set_data({seq}, flags={flags}) failed (no free cells?)"
            )
        if self.cells is None or flags & llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY:
            return
        if positions is None:
            self._cells_unknown()
            return
        cells = np.concatenate(positions).astype(np.int64) if positions else np.empty(0, np.int64)
        self.cells.remove(-1, -1, seq)  # the sequence's cells go first, then one ubatch
        self.cells.place(cells, max(len(cells), 1), seq)  # cells: int64 [n]

    def close(self) -> None:
        if self.ptr:
            self._batch.free()
            if self.embd_batch is not None:
                self.embd_batch.free()
            llama_cpp.llama_free(self.ptr)
            self.ptr = None


def _u8_ptr(buf: np.ndarray):
    return buf.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
