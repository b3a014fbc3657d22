"""KVMem sessions on a hybrid memory (the tiny synthetic qwen35): only attention blocks are
windowed, harvested and restored; the recurrent state sees every token, survives restores
through the staging sequence, and is rewound by ReplaySSM before every replay or cut."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from kvmem.config import KVMemConfig, QueryReplay
from kvmem.engine.engine import Engine
from kvmem.engine.hybrid.hybrid_codec import build_hybrid_state, parse_hybrid_state
from kvmem.engine.hybrid.recurrent_state import read_recurrent
from kvmem.engine.llama.context import ContextSettings, LlamaContext
from kvmem.engine.transfer.state_codec import parse_state
from kvmem.engine_settings import EngineSettings
from kvmem.errors import StateFormatError
from kvmem.memory.host_store import BlockKV
from kvmem.memory.spans import TokenSpan

from .helpers import GREEDY, TINY_OVER
from .hybrid_models import tiny_hybrid_path  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow

BT = 32
OVER = TINY_OVER  # a 2-block prefill stream: the snapshot counts below assume it


def tokens(n: int, seed: int = 0) -> list[int]:
    return [1 + (7 * i + 13 * seed) % 900 for i in range(n)]


def hybrid_engine(path: Path, kvmem: KVMemConfig, trace: io.StringIO | None = None) -> Engine:
    settings = EngineSettings(
        model_path=str(path), n_ctx=2048, n_batch=64, n_ubatch=64, n_threads=1, kvmem=kvmem
    )
    return Engine(settings, trace_stream=trace)


@pytest.fixture(scope="module")
def plain(tiny_hybrid_path: Path) -> Iterator[Engine]:  # noqa: F811
    e = hybrid_engine(tiny_hybrid_path, KVMemConfig(enabled=False))
    yield e
    e.close()


@pytest.fixture(scope="module")
def over(tiny_hybrid_path: Path) -> Iterator[tuple[Engine, io.StringIO]]:  # noqa: F811
    trace = io.StringIO()
    e = hybrid_engine(tiny_hybrid_path, OVER, trace)
    yield e, trace
    e.close()


def turns(engine: Engine, base: list[int], n_turns: int = 3) -> tuple[list, list]:
    prompt, outs, rows = list(base[:100]), [], []
    for t in range(n_turns):
        out = list(engine.generate(prompt, sampling=GREEDY, max_tokens=8, logits_out=rows))
        outs.append(out)
        prompt = prompt + out + base[100 + 60 * t : 160 + 60 * t]
    return outs, rows


def test_under_budget_logits_equal_plain_llama_cpp(plain: Engine, tiny_hybrid_path) -> None:  # noqa: F811
    kv = KVMemConfig(budget=1024, gen_reserve=128, block_tokens=BT)
    engine = hybrid_engine(tiny_hybrid_path, kv)
    try:
        base = tokens(400, seed=1)
        plain.reset()
        out_p, rows_p = turns(plain, base)
        out_k, rows_k = turns(engine, base)
        assert out_k == out_p
        assert len(rows_k) == len(rows_p) == 24
        for a, b in zip(rows_k, rows_p, strict=True):
            np.testing.assert_array_equal(a, b)
        session = engine.session
        assert len(session.store) == session.table.n_complete_blocks >= 7  # harvested
        assert engine.last_turn.cached_tokens == 175  # multi-turn reuse: the whole history
        assert read_recurrent(engine.ctx).same_as(read_recurrent(plain.ctx))
    finally:
        engine.close()


def test_round_trip_of_attention_blocks_keeps_logits_and_recurrent_state(
    tiny_hybrid_path,  # noqa: F811
) -> None:
    kv = KVMemConfig(budget=1024, gen_reserve=128, block_tokens=BT)
    a, b = hybrid_engine(tiny_hybrid_path, kv), hybrid_engine(tiny_hybrid_path, kv)
    try:
        prompt = tokens(200, seed=2)
        for e in (a, b):
            list(e.generate(prompt, sampling=GREEDY, max_tokens=1))
        before = read_recurrent(a.ctx)
        a.session.window.evict([1, 3])
        assert read_recurrent(a.ctx).same_as(before)
        a.session.last_turn.add(a.session.window.restore_own([1, 3]))
        assert read_recurrent(a.ctx).same_as(before)  # the staging blob carried seq 0's
        longer = prompt + tokens(40, seed=3)
        rows_a: list[np.ndarray] = []
        rows_b: list[np.ndarray] = []
        out_a = list(a.generate(longer, sampling=GREEDY, max_tokens=4, logits_out=rows_a))
        out_b = list(b.generate(longer, sampling=GREEDY, max_tokens=4, logits_out=rows_b))
        assert a.last_turn.cached_tokens == 200 and out_a == out_b
        for x, y in zip(rows_a, rows_b, strict=True):
            np.testing.assert_array_equal(x, y)
    finally:
        a.close()
        b.close()


def test_codecs_refuse_what_they_do_not_know(over) -> None:
    engine, _ = over
    list(engine.generate(tokens(40, seed=9), sampling=GREEDY, max_tokens=1))
    blob = bytes(engine.ctx.get_state(0))
    parse_hybrid_state(blob, cell_ext=True)  # the real layout parses
    with pytest.raises(StateFormatError, match="hybrid or recurrent"):
        parse_state(blob, cell_ext=True)  # the plain codec refuses a hybrid blob
    with pytest.raises(StateFormatError):
        parse_hybrid_state(blob[:-7], cell_ext=True)  # a recurrent part cut short
    with pytest.raises(StateFormatError):
        parse_hybrid_state(blob + bytes(12), cell_ext=True)  # an unknown extra tensor


def test_over_budget_windows_attention_only_and_replays_from_the_snapshot(
    over,
    tiny_hybrid_path,  # noqa: F811
) -> None:
    engine, trace = over
    engine.reset()
    prompt = tokens(300, seed=4)
    query = TokenSpan(268, 300)
    out = list(engine.generate(prompt, query=query, sampling=GREEDY, max_tokens=1))
    st = engine.last_turn
    assert len(out) == 1 and st.evicted_blocks > 0
    assert engine.session.window.cells_used() <= OVER.gpu_cells
    got = parse_hybrid_state(bytes(engine.ctx.get_state(0)), cell_ext=True)
    assert len(got.attn.positions) < 300  # attention windowed
    assert got.recurrent.positions.tolist() == [299]  # the recurrent state saw every token
    _ = trace


def test_replay_state_equals_history_then_query_once(tiny_hybrid_path) -> None:  # noqa: F811
    """After a replay, the recurrent state equals a reference that processed the pre-query
    history (the first pass) and then the query once against the window, bit for bit."""
    on = KVMemConfig(**{**_fields(OVER), "query_replay": QueryReplay.ON})
    off = KVMemConfig(**{**_fields(OVER), "query_replay": QueryReplay.OFF})
    prompt = tokens(300, seed=5)
    query = TokenSpan(268, 300)
    e_on, e_off = hybrid_engine(tiny_hybrid_path, on), hybrid_engine(tiny_hybrid_path, off)
    ref = LlamaContext(
        e_on.model, ContextSettings(n_cells=512, n_batch=64, n_ubatch=64, n_threads=1)
    )
    try:
        list(e_on.generate(prompt, query=query, sampling=GREEDY, max_tokens=1))
        list(e_off.generate(prompt, query=query, sampling=GREEDY, max_tokens=1))
        assert e_on.last_turn.replayed_tokens == 32 and e_off.last_turn.replayed_tokens == 0
        start = 268
        # the pre-query state, read by the replay-off session's first pass at the boundary
        pre = [s for s in e_off.session.ssm.checkpoints._snaps if s.pos == start - 1]
        assert len(pre) == 1
        replayed = read_recurrent(e_on.ctx)
        window = parse_hybrid_state(bytes(e_on.ctx.get_state(0)), cell_ext=True).attn
        # the reference's cache in the session's cell order (flash attention sums over the
        # cells in cache order): the window's cells before the query, the query's slots
        # held by placeholders that are removed before the query is decoded once
        cells = np.flatnonzero(window.positions < start)  # [n_kept] cache slots
        assert 0 < len(cells) < start  # blocks left the window
        query_slots = np.flatnonzero(window.positions >= start)  # [32]
        order = np.sort(np.concatenate([cells, query_slots]))  # [n_cells]
        blob_block = BlockKV(
            -1,
            window.positions[order],
            [k[order] for k in window.k],
            [v[order] for v in window.v],
            None if window.ext is None else window.ext[order],
        )
        blob = build_hybrid_state(window.layout, [blob_block], 0, pre[0].parse())
        ref.set_state(blob, 0)
        ref.seq_rm(0, start, -1)  # the placeholders (the pre-query state ends at start - 1)
        ref.decode(prompt[start:], start, [False] * 31 + [True])
        after = parse_hybrid_state(bytes(ref.get_state(0)), cell_ext=True).attn
        np.testing.assert_array_equal(after.positions, window.positions)  # the same layout
        assert read_recurrent(ref).same_as(replayed)
        # the first pass's state (query folded in against the old window) is another one
        assert not read_recurrent(e_off.ctx).same_as(replayed)
    finally:
        ref.close()
        e_on.close()
        e_off.close()


def _fields(c: KVMemConfig) -> dict:
    return {f: getattr(c, f) for f in c.__slots__}


def test_multi_turn_over_budget(over, tiny_hybrid_path) -> None:  # noqa: F811
    engine, _ = over
    engine.reset()
    base = tokens(500, seed=6)
    prompt = list(base[:260])
    for t in range(3):
        out = list(engine.generate(prompt, sampling=GREEDY, max_tokens=6, ignore_eos=True))
        st = engine.last_turn
        n = engine.session.table.n_tokens
        assert read_recurrent(engine.ctx).positions.tolist() == [n - 1]
        assert engine.session.window.cells_used() <= OVER.gpu_cells
        if t:
            # the frontier (the prompt's end) is a snapshot: only the new tokens are processed
            assert st.cached_tokens == len(prompt) - 6 - 60 and st.reprocessed_tokens == 5
        prompt = prompt + out + base[260 + 60 * t : 320 + 60 * t]
    assert engine.session.ssm.stats.fallbacks == 0


def test_truncation_inside_history_rewinds_to_a_snapshot(over, tiny_hybrid_path) -> None:  # noqa: F811
    engine, _ = over
    fresh = hybrid_engine(tiny_hybrid_path, OVER)
    try:
        first = tokens(300, seed=7)
        # a cut before every snapshot: the fallback re-processes from the start, exactly
        # what a fresh session computes
        engine.reset()
        list(engine.generate(first, sampling=GREEDY, max_tokens=4, ignore_eos=True))
        second = first[:150] + tokens(120, seed=8)
        rows_w: list[np.ndarray] = []
        rows_f: list[np.ndarray] = []
        out_w = list(engine.generate(second, sampling=GREEDY, max_tokens=6, logits_out=rows_w))
        st = engine.last_turn
        assert (st.cached_tokens, st.reprocessed_tokens) == (0, 150)
        out_f = list(fresh.generate(second, sampling=GREEDY, max_tokens=6, logits_out=rows_f))
        assert out_w == out_f
        for a, b in zip(rows_w, rows_f, strict=True):
            np.testing.assert_array_equal(a, b)
        assert read_recurrent(engine.ctx).same_as(read_recurrent(fresh.ctx))
        # a cut after a snapshot (the second prompt's query boundary 270 - 32 = 238 and the
        # block boundary 256): the history goes back to the latest one before the cut and
        # re-processes from there
        assert engine.session.ssm.checkpoints.positions[:2] == [237, 255]
        third = second[:260] + tokens(30, seed=9)
        list(engine.generate(third, sampling=GREEDY, max_tokens=2))
        st = engine.last_turn
        assert st.cached_tokens == 256 and st.reprocessed_tokens == 4
        n = engine.session.table.n_tokens
        assert read_recurrent(engine.ctx).positions.tolist() == [n - 1]
    finally:
        fresh.close()


def test_long_generation_past_the_reserve(over) -> None:
    engine, trace = over
    engine.reset()
    trace.truncate(0)
    out = list(
        engine.generate(tokens(200, seed=10), sampling=GREEDY, max_tokens=220, ignore_eos=True)
    )
    st = engine.last_turn
    assert len(out) == 220 and st.finish_reason == "length"
    assert st.spilled_blocks >= 2 and "KVMEM_SPILL" in trace.getvalue()
    assert engine.session.window.peak_cells <= OVER.gpu_cells
    n = engine.session.table.n_tokens
    assert engine.session.store.block_ids() == tuple(range(n // BT))
    assert read_recurrent(engine.ctx).positions.tolist() == [n - 1]


def test_disk_store_and_conversations_are_refused_for_hybrids(tiny_hybrid_path, tmp_path) -> None:  # noqa: F811
    from kvmem.errors import ConfigError

    with pytest.raises(ConfigError, match="--kvmem-conversations: not supported for hybrid"):
        hybrid_engine(tiny_hybrid_path, KVMemConfig(block_tokens=BT, conversations=2))
    with pytest.raises(ConfigError, match="--kvmem-disk-dir: not supported for hybrid"):
        hybrid_engine(tiny_hybrid_path, KVMemConfig(block_tokens=BT, disk_dir=str(tmp_path)))


def test_drafts_on_a_hybrid_over_budget(over, tiny_hybrid_path) -> None:  # noqa: F811
    """Drafts in a hybrid session past the reserve (random weights rarely repeat, so an
    oracle drafter proposes the plain output with every 5th token wrong): verification folds
    only accepted tokens into the recurrent state (snapshot, rewind, re-decode), rejected
    cells are never recorded, and greedy output equals decoding without drafts."""
    from kvmem.engine.spec.spec_decode import SpecDecoder
    from kvmem.spec_config import SpecConfig, SpecType

    plain, _ = over
    drafted = hybrid_engine(tiny_hybrid_path, OVER)
    try:
        prompt = tokens(240, seed=11)
        plain.reset()
        want = list(plain.generate(prompt, sampling=GREEDY, max_tokens=120, ignore_eos=True))

        def oracle(history, n: int) -> list[int]:
            k = len(history) - len(prompt)  # tokens emitted so far: want[k] comes next
            return [t if (k + i) % 5 else (t + 1) % 900 for i, t in enumerate(want[k : k + n])]

        drafted.session.spec = SpecDecoder(
            SpecConfig(type=SpecType.NGRAM, gate=False), drafter=oracle
        )
        got = list(drafted.generate(prompt, sampling=GREEDY, max_tokens=120, ignore_eos=True))
        st = drafted.last_turn
        assert got == want
        assert 0 < st.draft_n_accepted < st.draft_n and st.spilled_blocks >= 1
        assert st.spilled_blocks == plain.last_turn.spilled_blocks
        assert drafted.session.tokens == plain.session.tokens
        n = drafted.session.table.n_tokens
        assert read_recurrent(drafted.ctx).positions.tolist() == [n - 1]
    finally:
        drafted.close()
