"""Plain llama.cpp + mtmd, without KVMem: the reference for the image identity test.

A context of its own, the prompt tokenized by mtmd_tokenize (text with the media marker,
one bitmap) and evaluated by mtmd_helper_eval_chunks, then greedy decoding."""

from __future__ import annotations

import ctypes

import llama_cpp
import numpy as np
from llama_cpp import mtmd_cpp as mtmd

from kvmem.engine.llama.rpc import model_devices


class MtmdReference:
    def __init__(self, model_path: str, mmproj: str, n_ctx: int = 2048) -> None:
        params = llama_cpp.llama_model_default_params()
        # once a test registered RPC workers in this process (test_rpc_engine), llama.cpp's
        # default device list holds theirs too: name the local devices, as the engine does
        self._devices = model_devices(())
        if self._devices is not None:
            params.devices = ctypes.cast(self._devices, ctypes.c_void_p)
        self.model = llama_cpp.llama_model_load_from_file(model_path.encode(), params)
        p = llama_cpp.llama_context_default_params()
        p.n_ctx, p.n_batch, p.n_ubatch = n_ctx, 512, 128
        p.n_threads = p.n_threads_batch = 2
        p.flash_attn_type = 1
        p.no_perf = True
        self.ctx = llama_cpp.llama_init_from_model(self.model, p)
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        mp = mtmd.mtmd_context_params_default()
        mp.use_gpu, mp.n_threads, mp.print_timings, mp.warmup = False, 2, False, False
        self.mtmd = mtmd.mtmd_init_from_file(mmproj.encode(), self.model, mp)
        self.marker = mtmd.mtmd_default_marker().decode()

    def chunks(self, text: str, rgb: np.ndarray):
        h, w, _ = rgb.shape
        buf = (ctypes.c_uint8 * rgb.size).from_buffer_copy(rgb.tobytes())
        bitmap = mtmd.mtmd_bitmap_init(w, h, buf)
        chunks = mtmd.mtmd_input_chunks_init()
        raw = text.encode()
        t = mtmd.mtmd_input_text(raw, len(raw), True, True)
        arr = (mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap)
        assert mtmd.mtmd_tokenize(self.mtmd, chunks, ctypes.byref(t), arr, 1) == 0
        mtmd.mtmd_bitmap_free(bitmap)
        return chunks

    def layout(self, chunks) -> list[tuple[str, list[int] | int]]:
        """[("text", ids) | ("image", n_rows)] in prompt order."""
        out: list[tuple[str, list[int] | int]] = []
        for i in range(mtmd.mtmd_input_chunks_size(chunks)):
            chunk = mtmd.mtmd_input_chunks_get(chunks, i)
            if mtmd.mtmd_input_chunk_get_type(chunk) == 0:
                n = ctypes.c_size_t(0)
                ptr = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                out.append(("text", [ptr[k] for k in range(n.value)]))
            else:
                out.append(("image", mtmd.mtmd_input_chunk_get_n_tokens(chunk)))
        return out

    def greedy(self, chunks, n_tokens: int) -> tuple[list[int], list[np.ndarray]]:
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self.ctx), True)
        n_past = llama_cpp.llama_pos(0)
        rc = mtmd.mtmd_helper_eval_chunks(
            self.mtmd, self.ctx, chunks, 0, 0, 512, True, ctypes.byref(n_past)
        )
        assert rc == 0
        out, logits = [], []
        pos = n_past.value
        for _ in range(n_tokens):
            row = np.ctypeslib.as_array(
                llama_cpp.llama_get_logits_ith(self.ctx, -1), shape=(self.n_vocab,)
            ).copy()
            logits.append(row)
            token = int(np.argmax(row))
            if llama_cpp.llama_vocab_is_eog(self.vocab, token):
                break
            out.append(token)
            batch = llama_cpp.llama_batch_init(1, 0, 1)
            batch.n_tokens = 1
            batch.token[0], batch.pos[0], batch.n_seq_id[0] = token, pos, 1
            batch.seq_id[0][0], batch.logits[0] = 0, 1
            assert llama_cpp.llama_decode(self.ctx, batch) == 0
            llama_cpp.llama_batch_free(batch)
            pos += 1
        return out, logits

    def close(self) -> None:
        mtmd.mtmd_free(self.mtmd)
        llama_cpp.llama_free(self.ctx)
        llama_cpp.llama_model_free(self.model)
