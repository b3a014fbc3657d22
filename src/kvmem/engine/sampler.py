"""Sampling through llama.cpp's sampler chain."""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence

import llama_cpp

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
        chain_params = llama_cpp.llama_sampler_chain_default_params()
        chain_params.no_perf = True
        self.ptr = llama_cpp.llama_sampler_chain_init(chain_params)
        self._ban(model_vocab, banned_tokens)
        self._add_grammar(model_vocab, grammar)
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
        self._add(llama_cpp.llama_sampler_init_logit_bias(n_vocab, len(tokens), biases))

    def _add_grammar(self, vocab, grammar: str | None) -> None:
        if not grammar:
            return
        g = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
        if not g:
            raise InvalidRequestError("the grammar could not be parsed", param="grammar")
        self._add(g)

    @staticmethod
    def check_grammar(vocab, grammar: str) -> None:
        """Parse `grammar` once (and free it): InvalidRequestError when llama.cpp refuses it."""
        g = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
        if not g:
            raise InvalidRequestError("the grammar could not be parsed", param="grammar")
        llama_cpp.llama_sampler_free(g)

    def sample(self, ctx_ptr, index: int = -1) -> int:
        """Sample from output row `index` and accept the token into the chain."""
        return int(llama_cpp.llama_sampler_sample(self.ptr, ctx_ptr, index))

    def close(self) -> None:
        if self.ptr:
            llama_cpp.llama_sampler_free(self.ptr)
            self.ptr = None
