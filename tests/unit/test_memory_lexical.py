"""BM25 over token n-grams and the rank fusion (memory/lexical.py), against plain loops."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvmem.memory.lexical import (
    BM25_K1,
    MAX_DF_FLOOR,
    MAX_DF_SHARE,
    NGRAMS,
    RRF_K,
    LexicalQuery,
    bm25_scores,
    fuse_ranks,
    query_terms,
)
from kvmem.memory.spans import TokenSpan


def _plain_bm25(history, bt, candidates, q_tokens, q_positions, share=MAX_DF_SHARE):
    """BM25 as a textbook loop: a block's terms are the n-grams ending on its tokens."""

    def block_terms(b):
        out = []
        for n in NGRAMS:
            for end in range(b * bt, (b + 1) * bt):
                if end - n + 1 >= 0:
                    out.append((n, tuple(history[end - n + 1 : end + 1])))
        return out

    query = set()
    for n in NGRAMS:
        for i in range(len(q_tokens) - n + 1):
            if all(q_positions[i + j + 1] == q_positions[i + j] + 1 for j in range(n - 1)):
                query.add((n, tuple(q_tokens[i : i + n])))
    docs = {b: block_terms(b) for b in candidates}
    scores = []
    for b in candidates:
        total = 0.0
        for term in query:
            tf = docs[b].count(term)
            if not tf:
                continue
            df = sum(1 for c in candidates if term in docs[c])
            if df > max(MAX_DF_FLOOR, share * len(candidates)):
                continue  # a stop phrase or the template's markup
            idf = math.log(1 + (len(candidates) - df + 0.5) / (df + 0.5))
            total += idf * tf * (BM25_K1 + 1) / (tf + BM25_K1)
        scores.append(total)
    return scores


def test_the_block_holding_the_queried_id_ranks_first():
    bt = 8
    rng = np.random.default_rng(0)
    history = rng.integers(0, 50, size=bt * 6, dtype=np.int64)  # [48]
    order_id = np.array([901, 902, 903, 904], dtype=np.int64)  # its digits: rare together
    history[3 * bt + 2 : 3 * bt + 6] = order_id
    query = np.concatenate([[7, 8], order_id]).astype(np.int64)  # [6]
    positions = np.arange(100, 106, dtype=np.int64)  # [6]
    scores = bm25_scores(history, bt, [0, 1, 2, 3, 4], query, positions)
    assert int(np.argmax(scores)) == 3
    assert scores[4] == 0.0 or scores[4] < scores[3]
    plain = _plain_bm25(history.tolist(), bt, [0, 1, 2, 3, 4], query.tolist(), positions.tolist())
    np.testing.assert_allclose(scores, plain, rtol=1e-12)


def test_a_phrase_most_blocks_hold_scores_nothing():
    bt, n_blocks = 4, 12
    history = np.zeros(bt * n_blocks, dtype=np.int64)  # [48]
    history[0::bt], history[1::bt] = 7, 8  # the phrase (7, 8) opens every block
    history[5 * bt + 2 : 5 * bt + 4] = [30, 31]  # one block also holds (30, 31)
    query = np.array([7, 8, 0, 30, 31], dtype=np.int64)  # [5]
    scores = bm25_scores(history, bt, list(range(n_blocks)), query, np.arange(5) + 60)
    assert [b for b in range(n_blocks) if scores[b] > 0] == [5]
    stop = bm25_scores(history, bt, list(range(n_blocks)), query[:2], np.arange(2) + 60)
    assert not stop.any()  # a query of stop phrases alone ranks nothing lexically
    kept = bm25_scores(history, bt, list(range(n_blocks)), query[:2], np.arange(2) + 60, 1.0)
    assert (kept > 0).all()  # --kvmem-lexical-max-df 1: no term is dropped


def test_the_df_share_drops_the_terms_held_by_more_blocks_than_it_allows():
    bt, n_blocks = 4, 100
    history = np.zeros(bt * n_blocks, dtype=np.int64)  # [400]
    for b in range(8):  # (7, 8) in 8 blocks: dropped at a 5% share, kept at 10%
        history[b * bt : b * bt + 2] = [7, 8]
    query, positions = np.array([7, 8]), np.array([900, 901])
    at5 = bm25_scores(history, bt, list(range(n_blocks)), query, positions, 0.05)
    at10 = bm25_scores(history, bt, list(range(n_blocks)), query, positions, 0.10)
    assert not at5.any()
    assert [b for b in range(n_blocks) if at10[b] > 0] == list(range(8))


def test_lexical_query_joins_spans_once_in_prompt_order():
    prompt = list(range(100, 120))
    q = LexicalQuery.of(prompt, (TokenSpan(15, 18), TokenSpan(2, 4), TokenSpan(16, 25)))
    assert q.positions.tolist() == [2, 3, 15, 16, 17, 18, 19]  # clipped at the prompt's end
    assert q.tokens.tolist() == [102, 103, 115, 116, 117, 118, 119]
    assert LexicalQuery.of(prompt, ()).tokens.shape == (0,)


def test_an_ngram_across_a_block_edge_counts_for_the_block_it_ends_in():
    bt = 4
    history = np.array([0, 0, 0, 5, 6, 0, 0, 0], dtype=np.int64)  # [8]; 5|6 spans blocks 0, 1
    scores = bm25_scores(history, bt, [0, 1], np.array([5, 6]), np.array([9, 10]))
    assert scores[0] == 0.0 and scores[1] > 0.0


def test_query_ngrams_do_not_cross_a_gap_between_spans():
    tokens = np.array([1, 2, 3, 4], dtype=np.int64)  # [4]
    joined = query_terms(tokens, np.array([10, 11, 20, 21]), 2)  # [n_terms]
    assert joined.shape == (2,)  # (1, 2) and (3, 4); not (2, 3)
    assert query_terms(tokens, np.array([10, 11, 12, 13]), 3).shape == (2,)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(min_value=1, max_value=8).flatmap(
        lambda n_blocks: st.tuples(
            st.just(n_blocks),
            st.lists(st.integers(0, 6), min_size=4 * n_blocks, max_size=4 * n_blocks),
            st.lists(st.integers(0, 6), min_size=0, max_size=9),
            st.sets(st.integers(0, n_blocks - 1), min_size=1),
        )
    ),
    st.booleans(),
    st.sampled_from([0.0, 0.05, 0.3, 1.0]),
)
def test_bm25_equals_the_plain_loop(case, gap, share):
    n_blocks, history, query, candidates = case
    positions = list(range(50, 50 + len(query)))
    if gap and len(query) > 2:
        positions = positions[:2] + [p + 7 for p in positions[2:]]
    cand = sorted(candidates)
    got = bm25_scores(np.array(history), 4, cand, np.array(query), np.array(positions), share)
    want = _plain_bm25(history, 4, cand, query, positions, share)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def _plain_fuse(dense, lexical, ids):
    def ranks(values):
        order = sorted(range(len(ids)), key=lambda i: (-values[i], -ids[i]))
        return {i: r + 1 for r, i in enumerate(order)}

    rd, rl = ranks(dense), ranks(lexical)
    return [
        1 / (RRF_K + rd[i]) + (1 / (RRF_K + rl[i]) if lexical[i] > 0 else 0.0)
        for i in range(len(ids))
    ]


def test_fusion_lifts_a_lexical_match_above_dense_only_blocks():
    ids = np.array([0, 1, 2, 3], dtype=np.int64)  # [4]
    dense = np.array([0.4, 0.3, 0.2, 0.1])  # [4]
    lexical = np.array([0.0, 0.0, 0.0, 5.0])  # [4]: only block 3 names the id
    fused = fuse_ranks(dense, lexical, ids)
    assert [int(i) for i in np.argsort(-fused)] == [3, 0, 1, 2]
    np.testing.assert_allclose(fused, _plain_fuse(dense, lexical, ids), rtol=1e-15)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), min_size=1, max_size=12, unique=False)
)
def test_fusion_equals_the_plain_ranks(pairs):
    ids = np.arange(len(pairs), dtype=np.int64)  # [n]
    dense = np.array([float(d) for d, _ in pairs])  # [n]
    lexical = np.array([float(x) for _, x in pairs])  # [n]
    np.testing.assert_allclose(
        fuse_ranks(dense, lexical, ids), _plain_fuse(dense, lexical, ids), rtol=1e-15
    )
