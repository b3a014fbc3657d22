"""Sampling through llama.cpp's sampler chain.

Bans (logit_bias -inf, ignore_eos) and a grammar are kept apart from the chain and
applied first; when they leave no token allowed (a finished grammar with EOS banned, or a
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
        self.ptr = _new_chain()  # penalties, top-k/p, min-p, temperature, dist or greedy
        self.bans = None  # logit_bias -inf (and ignore_eos), applied first
        self.grammar = None  # checked on the chosen token, applied to all on a rejection
        self.exhausted = False  # a sample found no allowed token: the generation ends
        self._cur: np.ndarray | None = None
        self._end = _end_token(model_vocab)
        self._n_vocab = int(llama_cpp.llama_vocab_n_tokens(model_vocab))
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
        self.bans = llama_cpp.llama_sampler_init_logit_bias(n_vocab, len(tokens), biases)

    def _add_grammar(self, vocab, grammar: str | None) -> None:
        if not grammar:
            return
        g = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
        if not g:
            raise InvalidRequestError("the grammar could not be parsed", param="grammar")
        self.grammar = g

    @staticmethod
    def check_grammar(vocab, grammar: str) -> None:
        """Parse `grammar` once (and free it): InvalidRequestError when llama.cpp refuses it."""
        g = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
        if not g:
            raise InvalidRequestError("the grammar could not be parsed", param="grammar")
        llama_cpp.llama_sampler_free(g)

    def sample(self, ctx_ptr, index: int = -1) -> int:
        """Sample from output row `index` and accept the token; the end token (not
        accepted, `exhausted` set) when the bans and grammar allow no token.

        As llama-server does, the token is chosen without the grammar first and only
        checked against it; the grammar is applied to the whole vocabulary (the costly
        part: every token against every parse) only when it rejects that token."""
        if self.bans is None and self.grammar is None:
            return int(llama_cpp.llama_sampler_sample(self.ptr, ctx_ptr, index))
        cur = self._fill(ctx_ptr, index)
        if self.bans is not None:
            self._apply(self.bans, cur)
        if not np.isfinite(cur["logit"]).any():
            return self._no_token()
        if self.grammar is None:
            return self._accept(self._pick(cur))
        allowed = cur["logit"].copy()
        token = self._pick(cur)
        if self._grammar_allows(token, float(allowed[token])):
            return self._accept(token)
        cur["id"] = np.arange(len(cur), dtype=np.int32)
        cur["logit"] = allowed
        cur["p"] = 0.0
        self._apply(self.grammar, cur)
        if not np.isfinite(cur["logit"]).any():
            return self._no_token()
        return self._accept(self._pick(cur))

    def _fill(self, ctx_ptr, index: int) -> np.ndarray:
        n_vocab = self._n_vocab
        if self._cur is None:
            self._cur = np.zeros(n_vocab, dtype=_TOKEN_DATA)
        cur = self._cur
        cur["id"] = np.arange(n_vocab, dtype=np.int32)
        logits = llama_cpp.llama_get_logits_ith(ctx_ptr, index)
        cur["logit"] = np.ctypeslib.as_array(logits, shape=(n_vocab,))
        cur["p"] = 0.0
        return cur

    @staticmethod
    def _apply(sampler, cur: np.ndarray) -> llama_cpp.llama_token_data_array:
        data = cur.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data))
        arr = llama_cpp.llama_token_data_array(data, len(cur), -1, False)
        llama_cpp.llama_sampler_apply(sampler, ctypes.byref(arr))
        return arr

    def _pick(self, cur: np.ndarray) -> int:
        arr = self._apply(self.ptr, cur)
        if not 0 <= arr.selected < arr.size:
            raise RuntimeError(f"the sampler selected no token ({arr.selected})")
        return int(arr.data[arr.selected].id)

    def _grammar_allows(self, token: int, logit: float) -> bool:
        one = np.array([(token, logit, 0.0)], dtype=_TOKEN_DATA)
        self._apply(self.grammar, one)
        return bool(np.isfinite(one["logit"][0]))

    def _accept(self, token: int) -> int:
        for sampler in (self.bans, self.grammar, self.ptr):
            if sampler is not None:
                llama_cpp.llama_sampler_accept(sampler, token)
        return token

    def _no_token(self) -> int:
        if self._end < 0:
            raise InvalidRequestError("the grammar and bans allow no token", "grammar")
        self.exhausted = True
        logger.info("no token is allowed by the grammar and bans: the generation ends")
        return self._end

    def close(self) -> None:
        for name in ("ptr", "bans", "grammar"):
            sampler = getattr(self, name)
            if sampler:
                llama_cpp.llama_sampler_free(sampler)
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
