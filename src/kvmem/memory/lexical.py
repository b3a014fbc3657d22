"""Lexical scores of the retrieval candidates: BM25 over token n-grams, fused with the
attention ranking by reciprocal rank.

The block summaries rank by how the query's vectors meet a block's keys. They are weak
on the exact strings an agent's question names (an order id, a file name, a vault): the
tokens of such strings (single digits, sub-words) are common one by one, and a summary
dilutes them. Their bigrams and trigrams are rare, so BM25 over token n-grams finds the
block that holds the string, and the fusion keeps what each ranking finds.

The lexical query is the task and the last message (`LexicalQuery`), not the trajectory
tail the attention query also reads: a tail of tool output shares its markup and its log
formats with every other round, and a rank fusion rewards any match by its rank alone.
For the same reason a term held by more than `MAX_DF_SHARE` of the candidates is no term:
it marks the template (`<tool_call>`, `</tool_response>`) or a stop phrase (`of the`), not
a place in the history.

The scores are a pure function of the history's tokens and the query's (a warm session
ranks as a fresh one), computed in one vectorized pass over the candidates' tokens at
each plan, so there is no index to keep in step with the history's cuts. A BM25 library
(`rank_bm25`, used by the text baseline) would build its corpus index on every plan; the
tests check these scores against a plain BM25.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvmem.memory.spans import TokenSpan

NGRAMS = (2, 3)  # the n-gram lengths scored (unigrams would match nearly every block)
BM25_K1 = 1.2  # term-frequency saturation; every block has the same length, so b is moot
RRF_K = 60  # the reciprocal-rank constant (Cormack et al.; the usual choice)
MAX_DF_SHARE = 0.05  # a term in more than this share of the candidates is dropped,
MAX_DF_FLOOR = 4  # unless it is in at most this many (a few candidates, several needles)
_TOKEN_BITS = 21  # token ids are folded to 21 bits: three fit one int64 key
_TOKEN_MASK = (1 << _TOKEN_BITS) - 1


@dataclass(frozen=True, slots=True)
class LexicalQuery:
    """The query's tokens for BM25, with their prompt positions (n-grams never cross a
    gap between spans)."""

    tokens: np.ndarray  # int64 [n]
    positions: np.ndarray  # int64 [n], ascending

    @classmethod
    def of(cls, prompt: Sequence[int], spans: Sequence[TokenSpan]) -> LexicalQuery:
        """The tokens of `spans` (overlaps counted once) in the prompt's order."""
        ranges = [np.arange(s.start, min(s.end, len(prompt)), dtype=np.int64) for s in spans]
        pos = np.unique(np.concatenate(ranges)) if ranges else np.zeros(0, np.int64)  # [n]
        ids = np.fromiter((prompt[p] for p in pos), dtype=np.int64, count=pos.shape[0])  # [n]
        return cls(tokens=ids, positions=pos)


def ngram_keys(tokens: np.ndarray, n: int) -> np.ndarray:
    """int64 [len(tokens) - n + 1]: one key per n-gram of `tokens` (int64 [len])."""
    t = np.asarray(tokens, dtype=np.int64)  # [len]
    m = max(0, t.shape[0] - n + 1)
    return ngram_keys_at(t, np.arange(m, dtype=np.int64), n)  # [m]


def query_terms(tokens: np.ndarray, positions: np.ndarray, n: int) -> np.ndarray:
    """int64 [n_terms]: the sorted distinct n-grams of the query, over runs of
    consecutive `positions` only (a query of several spans has no n-gram across them)."""
    tok = np.asarray(tokens, dtype=np.int64)  # [n_query]
    pos = np.asarray(positions, dtype=np.int64)  # [n_query]
    keys = ngram_keys(tok, n)  # [n_query - n + 1]
    if keys.shape[0] == 0:
        return keys
    steps = np.diff(pos) == 1  # [n_query - 1]
    run = np.ones(keys.shape[0], dtype=bool)  # [n_query - n + 1]
    for i in range(n - 1):
        run &= steps[i : i + keys.shape[0]]
    return np.unique(keys[run])


def bm25_scores(
    history: np.ndarray,
    block_tokens: int,
    candidates: Sequence[int],
    query_tokens: np.ndarray,
    query_positions: np.ndarray,
    max_df_share: float = MAX_DF_SHARE,
) -> np.ndarray:
    """float64 [n_candidates]: each candidate block's BM25 score for the query's n-grams.

    A block's terms are the n-grams ending on its tokens (one that starts in the block
    before counts here). The collection is the candidates: a term's document frequency is
    the number of candidates holding it, idf = ln(1 + (N - df + 0.5) / (df + 0.5)); a term
    with df > max(MAX_DF_FLOOR, max_df_share * N) scores nothing.
    """
    cand = np.asarray(candidates, dtype=np.int64)  # [n_cand]
    hist = np.asarray(history, dtype=np.int64)  # [n_history]
    out = np.zeros(cand.shape[0], dtype=np.float64)  # [n_cand]
    if cand.shape[0] == 0:
        return out
    ends = (cand[:, None] * block_tokens + np.arange(block_tokens)[None, :]).ravel()  # [n_cand*B]
    owner = np.repeat(np.arange(cand.shape[0]), block_tokens)  # [n_cand*B]
    for n in NGRAMS:
        terms = query_terms(query_tokens, query_positions, n)  # [n_terms]
        if terms.shape[0] == 0:
            continue
        starts = ends - (n - 1)  # [n_cand*B]
        ok = starts >= 0
        keys = ngram_keys_at(hist, starts[ok], n)  # [n_ok]
        slot = np.searchsorted(terms, keys)  # [n_ok]
        hit = terms[np.minimum(slot, terms.shape[0] - 1)] == keys  # [n_ok]
        out += _bm25(owner[ok][hit], slot[hit], cand.shape[0], terms.shape[0], max_df_share)
    return out


def ngram_keys_at(history: np.ndarray, starts: np.ndarray, n: int) -> np.ndarray:
    """int64 [len(starts)]: the key of the n-gram of `history` starting at each of `starts`."""
    key = history[starts] & _TOKEN_MASK  # [n_starts]
    for i in range(1, n):
        key = (key << _TOKEN_BITS) | (history[starts + i] & _TOKEN_MASK)
    return key


def _bm25(
    block: np.ndarray, term: np.ndarray, n_blocks: int, n_terms: int, max_df_share: float
) -> np.ndarray:
    """float64 [n_blocks]: BM25 from the (block, term) pair of every matched n-gram."""
    pairs, tf = np.unique(block * n_terms + term, return_counts=True)  # [n_pairs]
    b, t = pairs // n_terms, pairs % n_terms
    df = np.bincount(t, minlength=n_terms).astype(np.float64)  # [n_terms]
    idf = np.log1p((n_blocks - df + 0.5) / (df + 0.5))  # [n_terms]
    idf[df > max(MAX_DF_FLOOR, max_df_share * n_blocks)] = 0.0  # markup and stop phrases
    gain = idf[t] * tf * (BM25_K1 + 1.0) / (tf + BM25_K1)  # [n_pairs]
    return np.bincount(b, weights=gain, minlength=n_blocks)


def rank_positions(values: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """int64 [n]: each entry's 1-based rank by `values` descending, ties to the larger id
    (the planner's order: the more recent block first)."""
    order = np.lexsort((-ids, -values))  # [n]
    rank = np.empty(values.shape[0], dtype=np.int64)  # [n]
    rank[order] = np.arange(1, values.shape[0] + 1)
    return rank


def fuse_ranks(dense: np.ndarray, lexical: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """float64 [n]: reciprocal rank fusion of the attention scores `dense` and the BM25
    scores `lexical` (float [n] each) of the blocks `ids` (int [n]); a block with no
    lexical match gets the dense term only."""
    d = np.asarray(dense, dtype=np.float64)  # [n]
    lex = np.asarray(lexical, dtype=np.float64)  # [n]
    block = np.asarray(ids, dtype=np.int64)  # [n]
    fused = 1.0 / (RRF_K + rank_positions(d, block))  # [n]
    lex_rank = rank_positions(lex, block)  # [n]
    matched = lex > 0  # [n]
    return fused + np.where(matched, 1.0 / (RRF_K + lex_rank), 0.0)
