"""Sampling through llama.cpp's sampler chain.

Bans (logit_bias -inf, ignore_eos) and a grammar form a separate constraint chain that is
applied first; when it leaves no token allowed (a finished grammar with EOS banned, or a
grammar whose next character no token can write), llama.cpp would accept a rejected token
and abort the process ("Unexpected empty grammar stack"). Instead the generation ends:
`sample` returns the vocabulary's end token without accepting it, and `exhausted` says so.
"""

from __future__ import annotations

import ctypes
import logging
import random
from collections.abc import Sequence

import llama_cpp
import numpy as np

from kvmem.errors import InvalidRequestError
from kvmem.sampling import SamplingParams

logger = logging.getLogger(__name__)


class Sampler:
    """One generation's sampler chain (penalties, grammar, top-k/p, min-p, temperature, dist)."""

    def __init__(
        self,
        model_vocab,
        params: SamplingParams,
        grammar: str | None = None,
        banned_tokens: Sequence[int] = (),
    ) -> None:
        self.ptr = _new_chain()
        self.constraints = None  # bans and grammar, applied before self.ptr
        self.exhausted = False  # a sample found no allowed token: the generation ends
        self._cur: np.ndarray | None = None
        self._end = _end_token(model_vocab)
        self._n_vocab = int(llama_cpp.llama_vocab_n_tokens(model_vocab))
        if banned_tokens or grammar:
            self.constraints = _new_chain()
            try:
                self._ban(model_vocab, banned_tokens)
                self._add_grammar(model_vocab, grammar)
            except BaseException:
                self.close()
                raise
        if params.repeat_penalty != 1.0 or params.presence_penalty or params.frequency_penalty:
            self._add(
                llama_cpp.llama_sampler_init_penalties(
                    llama_cpp.llama_vocab_n_tokens(model_vocab),
                    params.repeat_last_n,
                    params.repeat_penalty,
                    params.frequency_penalty,
                    params.presence_penalty,
                )
            )
        if params.greedy:
            self._add(llama_cpp.llama_sampler_init_greedy())
            return
        if params.top_k > 0:
            self._add(llama_cpp.llama_sampler_init_top_k(params.top_k))
        if 0.0 < params.top_p < 1.0:
            self._add(llama_cpp.llama_sampler_init_top_p(params.top_p, 1))
        if params.min_p > 0.0:
            self._add(llama_cpp.llama_sampler_init_min_p(params.min_p, 1))
        self._add(llama_cpp.llama_sampler_init_temp(params.temperature))
        seed = params.seed if params.seed >= 0 else random.getrandbits(32)
        self._add(llama_cpp.llama_sampler_init_dist(seed & 0xFFFFFFFF))

    def _add(self, sampler) -> None:
        llama_cpp.llama_sampler_chain_add(self.ptr, sampler)

    def _ban(self, vocab, tokens: Sequence[int]) -> None:
        if not tokens:
            return
        biases = (llama_cpp.llama_logit_bias * len(tokens))()
        for i, tok in enumerate(tokens):
            biases[i].token = tok
            biases[i].bias = float("-inf")
        n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
        bias = llama_cpp.llama_sampler_init_logit_bias(n_vocab, len(tokens), biases)
        llama_cpp.llama_sampler_chain_add(self.constraints, bias)

    def _add_grammar(self, vocab, grammar: str | None) -> None:
        if not grammar:
            return
        g = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
        if not g:
            raise InvalidRequestError("the grammar could not be parsed", param="grammar")
        llama_cpp.llama_sampler_chain_add(self.constraints, g)

    @staticmethod
    def check_grammar(vocab, grammar: str) -> None:
        """Parse `grammar` once (and free it): InvalidRequestError when llama.cpp refuses it."""
        g = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
        if not g:
            raise InvalidRequestError("the grammar could not be parsed", param="grammar")
        llama_cpp.llama_sampler_free(g)

    def sample(self, ctx_ptr, index: int = -1) -> int:
        """Sample from output row `index` and accept the token into the chain; the end
        token (not accepted, `exhausted` set) when the constraints allow no token."""
        if self.constraints is None:
            return int(llama_cpp.llama_sampler_sample(self.ptr, ctx_ptr, index))
        n_vocab = self._n_vocab
        if self._cur is None or len(self._cur) != n_vocab:
            self._cur = np.zeros(n_vocab, dtype=_TOKEN_DATA)
        cur = self._cur
        cur["id"] = np.arange(n_vocab, dtype=np.int32)
        logits = llama_cpp.llama_get_logits_ith(ctx_ptr, index)
        cur["logit"] = np.ctypeslib.as_array(logits, shape=(n_vocab,))
        cur["p"] = 0.0
        data = cur.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data))
        arr = llama_cpp.llama_token_data_array(data, n_vocab, -1, False)
        llama_cpp.llama_sampler_apply(self.constraints, ctypes.byref(arr))
        if not np.isfinite(cur["logit"][: arr.size]).any():
            if self._end < 0:
                raise InvalidRequestError("the grammar and bans allow no token", "grammar")
            self.exhausted = True
            logger.info("no token is allowed by the grammar and bans: the generation ends")
            return self._end
        llama_cpp.llama_sampler_apply(self.ptr, ctypes.byref(arr))
        if not 0 <= arr.selected < arr.size:
            raise RuntimeError(f"the sampler selected no token ({arr.selected})")
        token = int(arr.data[arr.selected].id)
        llama_cpp.llama_sampler_accept(self.constraints, token)
        llama_cpp.llama_sampler_accept(self.ptr, token)
        return token

    def close(self) -> None:
        for name in ("ptr", "constraints"):
            chain = getattr(self, name)
            if chain:
                llama_cpp.llama_sampler_free(chain)
                setattr(self, name, None)


_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


def _new_chain():
    chain_params = llama_cpp.llama_sampler_chain_default_params()
    chain_params.no_perf = True
    return llama_cpp.llama_sampler_chain_init(chain_params)


def _end_token(vocab) -> int:
    """The token a generation ends with when nothing else is allowed (EOS, else EOT)."""
    eos = int(llama_cpp.llama_vocab_eos(vocab))
    return eos if eos >= 0 else int(llama_cpp.llama_vocab_eot(vocab))
