"""score_blocks against a plain-Python loop over layers, tokens, heads and blocks."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvmem.errors import MemoryLayoutError
from kvmem.memory import scorer
from kvmem.memory.ggml_types import GgmlType
from kvmem.memory.retrieval_index import KeyGeometry, RetrievalIndex
from kvmem.memory.rope import RopeParams, RopeType, apply_rope
from kvmem.memory.scorer import QueryVectors, ScoreAggregate, ScoreMode, score_blocks

N_LAYER, N_HEAD, N_HEAD_KV, HEAD_DIM = 3, 4, 2, 8


def _geometry(rope_type: RopeType) -> KeyGeometry:
    return KeyGeometry(
        N_LAYER, N_HEAD_KV, HEAD_DIM, GgmlType.F32, RopeParams(rope_type, n_rot=8), 0
    )


def _build_index(g: KeyGeometry, n_blocks: int, rng: np.random.Generator) -> RetrievalIndex:
    index = RetrievalIndex(g, [0, 1, 2])
    for b in range(n_blocks):
        positions = np.arange(b * 4, b * 4 + 4, dtype=np.int32)  # [n_tokens]
        content = rng.standard_normal((4, N_HEAD_KV, HEAD_DIM)).astype(np.float32)
        rows = [
            apply_rope(content * (layer + 1), positions, g.rope).reshape(4, -1).view(np.uint8)
            for layer in range(N_LAYER)
        ]
        index.add(b, positions, rows)
    return index


def _unrope_loop(vec: list[float], pos: int, params: RopeParams) -> list[float]:
    out = list(vec)
    half = params.n_rot // 2
    for i in range(half):
        theta = -pos * params.freq_scale * params.freq_base ** (-2.0 * i / params.n_rot)
        a, b = (2 * i, 2 * i + 1) if params.rope_type is RopeType.NORM else (i, i + half)
        out[a] = vec[a] * math.cos(theta) - vec[b] * math.sin(theta)
        out[b] = vec[a] * math.sin(theta) + vec[b] * math.cos(theta)
    return out


def _score_loop(
    index: RetrievalIndex,
    block_ids: list[int],
    query: QueryVectors,
    mode: ScoreMode = ScoreMode.KEY_BOUND,
    aggregate: ScoreAggregate = ScoreAggregate.MEAN,
) -> list[float]:
    summaries = dict(zip(block_ids, index.stats(block_ids), strict=True))
    return _stats_loop(summaries, index.layers, index.geometry, query, mode, aggregate)


def _stats_loop(
    summaries: dict[int, np.ndarray],
    layers: tuple[int, ...],
    g: KeyGeometry,
    query: QueryVectors,
    mode: ScoreMode = ScoreMode.KEY_BOUND,
    aggregate: ScoreAggregate = ScoreAggregate.MEAN,
) -> list[float]:
    """The plain loop over the summaries float32 [3 (mean, min, max), n_scored, n_kv, hd] of
    the candidates, in the dict's order."""
    block_ids = list(summaries)
    stacked = np.stack([summaries[b] for b in block_ids]).astype(np.float64)
    means, mins, maxs = stacked[:, 0], stacked[:, 1], stacked[:, 2]  # [n_blocks, L, kv, hd]

    def logit(vec: list[float], b: int, j: int, kvh: int) -> float:
        if mode is ScoreMode.MEAN_KEY:
            dot = sum(vec[d] * means[b, j, kvh, d] for d in range(g.head_dim))
        else:  # the largest q.k any key within the per-channel [min, max] box can reach
            dot = sum(
                max(vec[d] * mins[b, j, kvh, d], vec[d] * maxs[b, j, kvh, d])
                for d in range(g.head_dim)
            )
        return dot / math.sqrt(g.head_dim)

    totals = [0.0] * len(block_ids)
    n_layers = 0
    for j, layer in enumerate(layers):
        if layer not in query.by_layer:
            continue
        n_layers += 1
        q = query.by_layer[layer]
        n_tokens, n_head = q.shape[0], q.shape[1]
        layer_totals = [0.0] * len(block_ids)
        for t in range(n_tokens):
            for h in range(n_head):
                kvh = h // (n_head // g.n_head_kv)
                vec = _unrope_loop([float(x) for x in q[t, h]], int(query.positions[t]), g.rope)
                logits = [logit(vec, b, j, kvh) for b in range(len(block_ids))]
                top = max(logits)
                exps = [math.exp(x - top) for x in logits]
                z = sum(exps)
                for b in range(len(block_ids)):
                    p = exps[b] / z
                    if aggregate is ScoreAggregate.MAX:
                        layer_totals[b] = max(layer_totals[b], p)
                    else:
                        layer_totals[b] += p
        norm = sum(layer_totals) if aggregate is ScoreAggregate.MAX else n_tokens * n_head
        for b in range(len(block_ids)):
            totals[b] += layer_totals[b] / norm
    return [x / n_layers for x in totals]


@pytest.mark.parametrize("aggregate", list(ScoreAggregate))
@pytest.mark.parametrize("mode", [ScoreMode.KEY_BOUND, ScoreMode.MEAN_KEY])
@pytest.mark.parametrize("rope_type", [RopeType.NORM, RopeType.NEOX])
def test_scores_match_loop(rope_type: RopeType, mode: ScoreMode, aggregate: ScoreAggregate) -> None:
    g = _geometry(rope_type)
    rng = np.random.default_rng(4)
    index = _build_index(g, n_blocks=6, rng=rng)
    positions = np.array([40, 41, 42], dtype=np.int32)  # [n_tokens]
    query = QueryVectors(
        positions=positions,
        by_layer={
            layer: rng.standard_normal((3, N_HEAD, HEAD_DIM)).astype(np.float32)
            for layer in (0, 2, 7)
        },
    )
    block_ids = [5, 0, 3, 2]
    got = score_blocks(index, block_ids, query, mode=mode, aggregate=aggregate)
    assert got.dtype == np.float32
    assert got.shape == (4,)
    expected = _score_loop(index, block_ids, query, mode, aggregate)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)
    assert float(got.sum()) == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("workers", [1, 3])
def test_chunked_and_threaded_scores_match_loop(
    workers: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scorer, "_CHUNK_ELEMENTS", 3 * 5)  # tiles of 3, 3, 3, 1 rows x 5 blocks
    g = _geometry(RopeType.NEOX)
    rng = np.random.default_rng(8)
    index = _build_index(g, n_blocks=5, rng=rng)
    positions = np.array([20, 21, 25, 30, 31], dtype=np.int32)  # [n_tokens]
    query = QueryVectors(
        positions=positions,
        by_layer={
            layer: rng.standard_normal((5, N_HEAD, HEAD_DIM)).astype(np.float32) for layer in (0, 1)
        },
    )
    block_ids = [0, 1, 2, 3, 4]
    got = score_blocks(index, block_ids, query, workers=workers)
    np.testing.assert_allclose(got, _score_loop(index, block_ids, query), rtol=0, atol=1e-6)
    got = score_blocks(index, block_ids, query, workers=workers, aggregate=ScoreAggregate.MAX)
    expected = _score_loop(index, block_ids, query, aggregate=ScoreAggregate.MAX)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)


def test_block_matching_the_query_scores_highest() -> None:
    g = _geometry(RopeType.NEOX)
    index = RetrievalIndex(g, [1])
    direction = np.zeros((N_HEAD_KV, HEAD_DIM), dtype=np.float32)  # [n_head_kv, head_dim]
    direction[:, 3] = 4.0
    for b in range(5):
        positions = np.arange(b * 2, b * 2 + 2, dtype=np.int32)  # [n_tokens]
        content = np.zeros(
            (2, N_HEAD_KV, HEAD_DIM), dtype=np.float32
        )  # [n_tokens, n_head_kv, head_dim]
        content[:, :, b] = 4.0  # block 3 points along the query's direction
        rows = [
            apply_rope(content, positions, g.rope).reshape(2, -1).view(np.uint8)
            for _ in range(N_LAYER)
        ]
        index.add(b, positions, rows)
    q_content = np.repeat(direction[None, :, None, :], 2, axis=2).reshape(1, N_HEAD, HEAD_DIM)
    positions = np.array([500], dtype=np.int32)  # [n_tokens]
    query = QueryVectors(positions, {1: apply_rope(q_content, positions, g.rope)})
    got = score_blocks(index, [0, 1, 2, 3, 4], query)
    assert int(np.argmax(got)) == 3
    others = got[[0, 1, 2, 4]]
    np.testing.assert_allclose(others, others[0], rtol=1e-6)  # the rest are equally unrelated


def test_empty_block_list() -> None:
    g = _geometry(RopeType.NORM)
    index = _build_index(g, n_blocks=2, rng=np.random.default_rng(0))
    query = QueryVectors(np.array([9]), {0: np.ones((1, N_HEAD, HEAD_DIM), np.float32)})
    got = score_blocks(index, [], query)
    assert got.shape == (0,)
    assert got.dtype == np.float32


def test_single_block_scores_one() -> None:
    g = _geometry(RopeType.NORM)
    index = _build_index(g, n_blocks=2, rng=np.random.default_rng(0))
    query = QueryVectors(np.array([9]), {0: np.ones((1, N_HEAD, HEAD_DIM), np.float32)})
    assert score_blocks(index, [1], query).tolist() == [1.0]


def test_bad_queries_are_rejected() -> None:
    g = _geometry(RopeType.NORM)
    index = _build_index(g, n_blocks=2, rng=np.random.default_rng(0))
    no_layer = QueryVectors(np.array([9]), {5: np.ones((1, N_HEAD, HEAD_DIM), np.float32)})
    with pytest.raises(MemoryLayoutError):
        score_blocks(index, [0, 1], no_layer)
    bad_heads = QueryVectors(np.array([9]), {0: np.ones((1, 3, HEAD_DIM), np.float32)})
    with pytest.raises(MemoryLayoutError):
        score_blocks(index, [0, 1], bad_heads)
    bad_positions = QueryVectors(np.array([9, 10]), {0: np.ones((1, N_HEAD, HEAD_DIM), np.float32)})
    with pytest.raises(MemoryLayoutError):
        score_blocks(index, [0, 1], bad_positions)
    with pytest.raises(MemoryLayoutError):
        score_blocks(
            index,
            [0, 9],
            QueryVectors(np.array([9]), {0: np.ones((1, N_HEAD, HEAD_DIM), np.float32)}),
        )


def test_sample_rows_is_an_even_sample_of_each_span_with_its_last_token() -> None:
    assert scorer.sample_rows(np.arange(10), 10) is None  # within the bound: every row
    assert scorer.sample_rows(np.arange(10), 3).tolist() == [3, 6, 9]
    assert scorer.sample_rows(np.arange(7), 0).tolist() == [6]  # at least one per span
    # a task of 10 tokens and a trajectory tail of 6: shares 2 and 1 of 4
    two = np.concatenate([np.arange(100, 110), np.arange(500, 506)])  # [16]
    assert scorer.sample_rows(two, 4).tolist() == [4, 9, 15]
    assert scorer.sample_rows(two, 8).tolist() == [1, 3, 5, 7, 9, 11, 13, 15]


def test_max_logits_scores_the_sampled_rows() -> None:
    """Over the bound, the scores are those of the sampled query tokens (checked against
    the plain loop); within it they are unchanged."""
    g = _geometry(RopeType.NEOX)
    rng = np.random.default_rng(9)
    index = _build_index(g, n_blocks=5, rng=rng)
    positions = np.concatenate([np.arange(60, 66), np.arange(90, 94)]).astype(np.int32)  # [10]
    layers = (0, 1, 2)
    query = QueryVectors(
        positions=positions,
        by_layer={
            layer: rng.standard_normal((10, N_HEAD, HEAD_DIM)).astype(np.float32)
            for layer in layers
        },
    )
    ids = [0, 1, 2, 3, 4]
    per_token = len(layers) * N_HEAD * len(ids)  # logits of one query token
    for aggregate in (ScoreAggregate.MEAN, ScoreAggregate.MAX):
        full = score_blocks(index, ids, query, aggregate=aggregate)
        same = score_blocks(index, ids, query, aggregate=aggregate, max_logits=10 * per_token)
        assert np.array_equal(full, same)
        got = score_blocks(index, ids, query, aggregate=aggregate, max_logits=5 * per_token + 1)
        rows = scorer.sample_rows(positions, 5)
        assert rows is not None and rows.tolist() == [1, 3, 5, 7, 9]
        sampled = QueryVectors(positions[rows], {k: v[rows] for k, v in query.by_layer.items()})
        expected = _score_loop(index, ids, sampled, aggregate=aggregate)
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)
        assert not np.allclose(got, full)


def _random_stats(rng: np.random.Generator, n: int, n_kv: int) -> np.ndarray:
    """float32 [n, 3, N_LAYER, n_kv, HEAD_DIM]: random (mean, min, max), min <= max."""
    stats = rng.standard_normal((n, 3, N_LAYER, n_kv, HEAD_DIM)).astype(np.float32)
    stats[:, 1] = -np.abs(stats[:, 1])
    stats[:, 2] = np.abs(stats[:, 2])
    return stats


def _assert_same_scores_and_ranking(got: np.ndarray, expected: list[float]) -> None:
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=0)
    ref = np.asarray(expected)  # [n_blocks]
    assert np.argsort(-got, kind="stable").tolist() == np.argsort(-ref, kind="stable").tolist()


@pytest.mark.parametrize("workers", [1, 3])
@pytest.mark.parametrize("candidates", ["most", "few"])
@pytest.mark.parametrize("aggregate", list(ScoreAggregate))
@pytest.mark.parametrize("mode", [ScoreMode.KEY_BOUND, ScoreMode.MEAN_KEY])
def test_table_scores_match_loop_after_removal_growth_and_replacement(
    mode: ScoreMode, aggregate: ScoreAggregate, candidates: str, workers: int
) -> None:
    """Rows moved by removals, a table grown past its capacity and replaced summaries
    score exactly as the plain loop over the summaries that were put."""
    g = _geometry(RopeType.NORM)
    rng = np.random.default_rng(11)
    index = RetrievalIndex(g, [0, 1, 2])
    held: dict[int, np.ndarray] = {}
    for ids in (range(0, 40), range(40, 100)):  # 100 rows: capacity 64 -> 128
        stats = _random_stats(rng, len(ids), N_HEAD_KV)
        index.put(list(ids), stats)
        held.update(zip(ids, stats, strict=True))
    index.remove([0, 7, 55, 99, 98])  # rows refilled from the end
    for b in (0, 7, 55, 99, 98):
        del held[b]
    replaced = _random_stats(rng, 2, N_HEAD_KV)
    index.put([3, 60], replaced)
    held[3], held[60] = replaced
    ids = sorted(held)[5:] if candidates == "most" else [60, 3, 91, 12, 40, 5]
    query = QueryVectors(
        positions=np.array([300, 301, 302, 310], dtype=np.int32),  # [n_tokens]
        by_layer={
            layer: rng.standard_normal((4, N_HEAD, HEAD_DIM)).astype(np.float32) for layer in (0, 2)
        },
    )
    got = score_blocks(index, ids, query, workers=workers, mode=mode, aggregate=aggregate)
    expected = _stats_loop({b: held[b] for b in ids}, index.layers, g, query, mode, aggregate)
    _assert_same_scores_and_ranking(got, expected)
    serial = score_blocks(index, ids, query, mode=mode, aggregate=aggregate)
    assert np.array_equal(got, serial)  # the thread count does not change a bit


@pytest.mark.parametrize("n_head", [2, 4, 8])  # GQA groups of 1, 2 and 4 query heads
@pytest.mark.parametrize("aggregate", list(ScoreAggregate))
def test_table_scores_match_loop_for_gqa_groups_and_sampled_queries(
    n_head: int, aggregate: ScoreAggregate
) -> None:
    g = _geometry(RopeType.NEOX)
    rng = np.random.default_rng(12 + n_head)
    index = RetrievalIndex(g, [0, 1, 2])
    stats = _random_stats(rng, 30, N_HEAD_KV)
    index.put(list(range(30)), stats)
    index.remove([4])
    ids = [b for b in range(30) if b not in (4, 29)]
    positions = np.concatenate([np.arange(50, 56), np.arange(200, 204)]).astype(np.int32)
    query = QueryVectors(
        positions=positions,  # [10]
        by_layer={
            layer: rng.standard_normal((10, n_head, HEAD_DIM)).astype(np.float32)
            for layer in (0, 1, 2)
        },
    )
    per_token = 3 * n_head * len(ids)  # logits of one query token
    rows = scorer.sample_rows(positions, 4)
    assert rows is not None and rows.tolist() == [2, 5, 9]  # shares 2 and 1 of the 4
    sampled = QueryVectors(positions[rows], {k: v[rows] for k, v in query.by_layer.items()})
    summaries = {b: stats[b] for b in ids}
    for max_logits, scored in ((0, query), (4 * per_token + 1, sampled)):
        got = score_blocks(index, ids, query, aggregate=aggregate, max_logits=max_logits)
        expected = _stats_loop(summaries, index.layers, g, scored, ScoreMode.KEY_BOUND, aggregate)
        _assert_same_scores_and_ranking(got, expected)


@pytest.mark.parametrize("aggregate", list(ScoreAggregate))
def test_scores_do_not_depend_on_the_other_rows_of_the_table(aggregate: ScoreAggregate) -> None:
    """The same candidates and query score bit for bit the same whatever else the table
    holds and wherever their rows sit: a score computed while later blocks are still being
    summarized (query_ahead.py) equals the one computed after."""
    g = _geometry(RopeType.NORM)
    rng = np.random.default_rng(5)
    stats = _random_stats(rng, 100, N_HEAD_KV)
    alone = RetrievalIndex(g, [0, 1, 2])
    alone.put(list(range(40)), stats[:40])
    crowded = RetrievalIndex(g, [0, 1, 2])
    crowded.put(list(range(99, 39, -1)), stats[40:][::-1])  # later blocks first
    crowded.put(list(range(40)), stats[:40])
    crowded.remove([99, 41])  # rows refilled from the end: the candidates' rows move
    query = QueryVectors(
        positions=np.array([500, 501, 502], dtype=np.int64),  # [n_tokens]
        by_layer={
            layer: rng.standard_normal((3, N_HEAD, HEAD_DIM)).astype(np.float32)
            for layer in (0, 1, 2)
        },
    )
    ids = list(range(3, 40))
    got = score_blocks(crowded, ids, query, workers=2, aggregate=aggregate)
    assert np.array_equal(got, score_blocks(alone, ids, query, workers=2, aggregate=aggregate))
