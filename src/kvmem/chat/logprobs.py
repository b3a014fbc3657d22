"""Token log-probabilities from one decode step's logits (`n_probs`, `logprobs`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvmem.sampling import SamplingParams


@dataclass(frozen=True, slots=True)
class TokenProb:
    id: int
    logprob: float


def token_probs(
    logits: np.ndarray, chosen: int, n: int, sampling: SamplingParams | None
) -> tuple[TokenProb, tuple[TokenProb, ...]]:
    """The chosen token's log-probability and the top `n`, from one step's logits.

    With `sampling` (llama-server's post_sampling_probs) the distribution is the one the
    sampler drew from: temperature, then top-k, top-p and min-p truncation, renormalized;
    tokens outside it are not listed. Without, it is the model's full softmax.
    """
    x = np.asarray(logits, dtype=np.float64)
    if sampling is not None and sampling.temperature > 0:
        x = x / sampling.temperature
    x = x - x.max()
    p = np.exp(x)
    p /= p.sum()
    if sampling is not None:
        p = _truncate(p, sampling)
    order = np.argsort(-p, kind="stable")
    top = tuple(TokenProb(int(i), _log(p[i])) for i in order[:n] if p[i] > 0 or sampling is None)
    return TokenProb(int(chosen), _log(p[chosen])), top


def _truncate(p: np.ndarray, s: SamplingParams) -> np.ndarray:
    order = np.argsort(-p, kind="stable")
    keep = np.zeros_like(p, dtype=bool)
    if s.temperature <= 0:
        keep[order[0]] = True
    else:
        k = s.top_k if s.top_k > 0 else len(p)
        cand = order[:k]
        if 0.0 < s.top_p < 1.0:
            cum = np.cumsum(p[cand])
            cand = cand[: int(np.searchsorted(cum, s.top_p)) + 1]
        if s.min_p > 0.0:
            cand = cand[p[cand] >= s.min_p * p[cand[0]]]
        keep[cand] = True
    out = np.where(keep, p, 0.0)
    return out / out.sum()


def _log(value: float) -> float:
    return float(np.log(value)) if value > 0 else float("-inf")
