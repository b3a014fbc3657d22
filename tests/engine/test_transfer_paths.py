"""The staged transfer path (reused, possibly pinned blob buffer; restores split into
pieces) gives bit-identical logits to the plain state-API path, for three KV types."""

from __future__ import annotations

import io

import numpy as np
import pytest

from kvmem.config import KVMemConfig, RestoreAheadMode
from kvmem.engine.llama.host_staging import StagingBuffer
from kvmem.engine.llama.llama_lib import host_buffer_allocator
from kvmem.engine.trace import TurnStats
from kvmem.engine.transfer.restore_ahead import RestoreAhead
from kvmem.engine.transfer.state_codec import kv_part_nbytes
from kvmem.engine.transfer.transfer_profile import TransferPath

from .helpers import GREEDY, filler_tokens, make_engine

pytestmark = pytest.mark.slow


def _never_evicted(engine, seed: int) -> tuple[list[int], int, np.ndarray]:
    """A five-block prompt, its next token, and the logits after it in a context that
    evicted nothing: (prompt, token, logits)."""
    tokens = filler_tokens(engine, 5 * 128 + 10, seed=seed)
    prompt, token = tokens[:-1], tokens[-1]
    engine.reset()
    engine.teacher_force(prompt, [token])
    engine.session.ctx.decode([token], len(prompt), [True])
    return prompt, token, engine.session.ctx.logits(-1)


def _logits_after(engine, prompt, token, staging) -> tuple[np.ndarray, int]:
    """Prefill, evict blocks 1-3, restore them through `staging`, decode `token`; returns
    the logits and the number of state writes the restore took."""
    engine.reset()
    session = engine.session
    session.transfer.staging = staging
    engine.teacher_force(prompt, [token])
    session.window.evict([1, 2, 3])
    session.transfer.profile.clear()
    stats = TurnStats()
    stats.add(session.window.restore({3: 384, 1: 128, 2: 256}))
    assert stats.stage_in_blocks == 3
    session.ctx.decode([token], len(prompt), [True])
    return session.ctx.logits(-1), session.transfer.profile.paths[TransferPath.STATE_SET].calls


@pytest.mark.parametrize("cache", ["f16", "q8_0", "q4_0"])
def test_staged_and_plain_paths_are_bit_identical(smollm2_path, cache):
    engine = make_engine(smollm2_path, cache=cache, kvmem=KVMemConfig(budget=2048, gen_reserve=256))
    try:
        prompt, token, reference = _never_evicted(engine, seed=11)

        plain, plain_writes = _logits_after(engine, prompt, token, None)
        layout = engine.session.transfer.layout
        one_block = 8 + kv_part_nbytes(layout, 128)
        # a buffer that holds one block's blob: the restore of three goes in three pieces
        small = StagingBuffer(host_buffer_allocator(), one_block)
        staged, staged_writes = _logits_after(engine, prompt, token, small)
        small.close()
        assert (plain_writes, staged_writes) == (1, 3)
        assert np.array_equal(plain, reference)
        assert np.array_equal(staged, reference)
    finally:
        engine.close()


@pytest.mark.parametrize("cache", ["f16", "q8_0", "q4_0"])
def test_a_restore_uses_the_blobs_built_ahead_only_for_exactly_its_blocks(smollm2_path, cache):
    """`prepare` builds a coming restore's blobs on another thread, piece by piece as the
    restore would (here a buffer of one block: three pieces). A restore of exactly those
    blocks sends them (no build on its own path); when the plan changed after the build
    started (another restore) it builds its own and leaves them. Both give the logits of a
    never-evicted context, bit for bit, in every cache type."""
    engine = make_engine(smollm2_path, cache=cache, kvmem=KVMemConfig(budget=2048, gen_reserve=256))
    session, transfer = engine.session, engine.session.transfer
    try:
        prompt, token, reference = _never_evicted(engine, seed=15)
        small = StagingBuffer(host_buffer_allocator(), 8 + kv_part_nbytes(transfer.layout, 128))
        transfer.staging = small
        paths = transfer.profile.paths
        for prepared, built_ahead, builds in (([1, 2, 3], 3, 0), ([1, 2], 0, 3)):
            session.ctx.seq_rm(0, len(prompt), -1)
            session.window.evict([1, 2, 3])
            assert transfer.prepare(prepared)
            transfer.profile.clear()
            stats = TurnStats()
            stats.add(session.window.restore({1: 128, 2: 256, 3: 384}))
            assert (stats.stage_in_blocks, stats.built_ahead_blocks) == (3, built_ahead)
            assert paths[TransferPath.STATE_BUILD].calls == builds
            assert paths[TransferPath.STATE_BUILD_AHEAD].calls == built_ahead
            assert paths[TransferPath.STATE_SET].calls == 3  # a write per piece either way
            assert transfer.ahead.take([1, 2, 3]) is None  # used up, or not these
            assert (transfer.ahead.take(prepared) is None) == (built_ahead > 0)
            transfer.drop_ahead()
            session.ctx.decode([token], len(prompt), [True])
            assert np.array_equal(session.ctx.logits(-1), reference)
        assert not transfer.prepare([1, 99])  # block 99 is not in the store: nothing built
        small.close()
    finally:
        engine.close()


def test_a_restore_sends_each_piece_built_ahead_while_the_builder_builds_the_next(
    smollm2_path, monkeypatch
):
    """A blob built ahead goes in `RESTORE_PIECES` pieces, one build job each: the restore
    writes a piece as soon as it is built. Here the builder may build piece k only once
    piece k - 1 is written (a restore that waited for the whole build would stall it), and
    the logits are those of a never-evicted context."""
    import threading

    from kvmem.engine.transfer import kv_transfer, restore_ahead

    engine = make_engine(
        smollm2_path, cache="q8_0", kvmem=KVMemConfig(budget=2048, gen_reserve=256)
    )
    session, transfer = engine.session, engine.session.transfer
    events: list[str] = []
    written = [threading.Event() for _ in range(4)]
    build, set_blob = restore_ahead.build_state, kv_transfer.KVTransfer._set_blob

    def gated_build(layout, blocks, seq, out, **kw):
        k = blocks[0].block_id - 1
        if k > 0 and not written[k - 1].wait(20):
            events.append(f"build {k} not let through")
        events.append(f"build {k}")
        return build(layout, blocks, seq, out, **kw)

    def noted_set(self, blob, blocks, starts):
        set_blob(self, blob, blocks, starts)
        events.append(f"write {blocks[0].block_id - 1}")
        written[blocks[0].block_id - 1].set()

    try:
        prompt, token, reference = _never_evicted(engine, seed=17)
        session.ctx.seq_rm(0, len(prompt), -1)
        session.window.evict([1, 2, 3, 4])
        monkeypatch.setattr(restore_ahead, "build_state", gated_build)
        monkeypatch.setattr(kv_transfer.KVTransfer, "_set_blob", noted_set)
        assert transfer.prepare([1, 2, 3, 4])
        transfer.profile.clear()
        stats = TurnStats()
        stats.add(session.window.restore({1: 128, 2: 256, 3: 384, 4: 512}))
        assert events == [f"{e} {k}" for k in range(4) for e in ("build", "write")]
        assert (stats.stage_in_blocks, stats.built_ahead_blocks) == (4, 4)
        assert transfer.profile.paths[TransferPath.STATE_BUILD].calls == 0
        session.ctx.decode([token], len(prompt), [True])
        assert np.array_equal(session.ctx.logits(-1), reference)
    finally:
        engine.close()


def test_harvest_copies_out_of_the_reused_buffer(smollm2_path):
    """Blocks in the host store own their memory: a later harvest through the same
    staging buffer leaves earlier blocks' bytes unchanged."""
    engine = make_engine(smollm2_path, kvmem=KVMemConfig(budget=2048, gen_reserve=256))
    try:
        tokens = filler_tokens(engine, 4 * 128 + 10, seed=12)
        engine.reset()
        engine.teacher_force(tokens[:-1], [tokens[-1]])
        store = engine.session.store
        before = {b: [a.copy() for a in store.get(b).k] for b in store.block_ids()}
        engine.session.transfer.harvest([0, 1, 2])  # overwrites the staging buffer
        for b, ks in before.items():
            assert all(np.array_equal(x, y) for x, y in zip(ks, store.get(b).k, strict=True))
            block = store.get(b)
            kv_bytes = sum(a.nbytes for a in [*block.k, *block.v])
            # every array is its own memory or a view of the block's own exact-size buffer
            assert all(a.base is None or a.base.nbytes == kv_bytes for a in block.k)
    finally:
        engine.close()


def test_threaded_copies_are_bit_identical(smollm2_path):
    """Copy-out on several threads into buffers touched ahead, and the restore blob built
    on several threads, give the logits of a never-evicted context, for f16 and q8_0."""
    from concurrent.futures import ThreadPoolExecutor

    from kvmem.engine.transfer.block_buffers import BlockBuffers

    for cache in ("f16", "q8_0"):
        engine = make_engine(
            smollm2_path, cache=cache, kvmem=KVMemConfig(budget=2048, gen_reserve=256)
        )
        transfer = engine.session.transfer
        try:
            prompt, token, reference = _never_evicted(engine, seed=13)
            transfer.copier = ThreadPoolExecutor(3)
            transfer.buffers = BlockBuffers(ahead_bytes=64 << 20)
            staging = transfer.staging
            threaded, writes = _logits_after(engine, prompt, token, staging)
            assert writes == 3  # three blocks: a piece each (RESTORE_PIECES)
            assert np.array_equal(threaded, reference)
            assert transfer.buffers.hits + transfer.buffers.misses >= 5
        finally:
            transfer.buffers.close()
            engine.close()


def test_blocks_whose_copy_out_is_pending_can_be_evicted_and_restored(smollm2_path):
    """A harvest with copy threads returns before its copies are done; evicting those
    blocks meanwhile is allowed (their bytes are in the staging buffer), and a restore waits
    for them: the logits equal a never-evicted context's."""
    from concurrent.futures import ThreadPoolExecutor

    engine = make_engine(smollm2_path, kvmem=KVMemConfig(budget=2048, gen_reserve=256))
    session, transfer = engine.session, engine.session.transfer
    try:
        transfer.copier = ThreadPoolExecutor(3)
        prompt, token, reference = _never_evicted(engine, seed=14)
        session.ctx.seq_rm(0, len(prompt), -1)
        result = transfer.harvest([1, 2, 3])  # fresh copies, replacing the stored ones
        assert result.block_ids == (1, 2, 3) and transfer._pending_ids == {1, 2, 3}
        session.window.evict([1, 2, 3])
        stats = TurnStats()
        stats.add(session.window.restore({1: 128, 2: 256, 3: 384}))
        assert not transfer._pending and stats.stage_in_blocks == 3
        session.ctx.decode([token], len(prompt), [True])
        assert np.array_equal(session.ctx.logits(-1), reference)
        assert transfer.profile.paths[TransferPath.COPY_OUT].calls >= 8  # 5 + these 3
    finally:
        engine.close()


def _stored(engine) -> dict[int, bytes]:
    store = engine.session.store
    return {b: b"".join(a.tobytes() for a in [*store.get(b).k, *store.get(b).v]) for b in (1, 2, 3)}


@pytest.mark.parametrize(
    ("cache", "flash_attn"), [("f16", True), ("q8_0", True), ("q4_0", True), ("f16", False)]
)
def test_native_and_numpy_copies_are_bit_identical(smollm2_path, cache, flash_attn):
    """The native copy-out and restore blob (kv_copy) against the numpy path: the same
    stored bytes, and logits after evict + restore equal to a never-evicted context's (f16
    without flash attention: V transposed in the blob)."""
    engine = make_engine(
        smollm2_path,
        cache=cache,
        flash_attn=flash_attn,
        kvmem=KVMemConfig(budget=2048, gen_reserve=256),
    )
    transfer = engine.session.transfer
    native = transfer.native
    assert native is not None
    try:
        tokens = filler_tokens(engine, 5 * 128 + 10, seed=15)
        prompt, token = tokens[:-1], tokens[-1]
        engine.reset()
        engine.teacher_force(prompt, [token])
        # the prefill loop is profiled: one llama_decode per chunk, and the time between
        paths = transfer.profile.paths
        chunks = -(-len(prompt) // engine.session.chunk_tokens)
        assert chunks >= 2
        assert paths[TransferPath.PREFILL_DECODE].calls == chunks
        assert paths[TransferPath.PREFILL_GAP].calls == chunks
        assert paths[TransferPath.PREFILL_GAP].ms > 0
        engine.session.ctx.decode([token], len(prompt), [True])
        reference = engine.session.ctx.logits(-1)
        assert transfer.layout.v_trans is not flash_attn
        got = {}
        for name, copy in (("numpy", None), ("native", native)):
            transfer.native = copy
            logits, writes = _logits_after(engine, prompt, token, transfer.staging)
            transfer.flush()
            got[name] = (logits, _stored(engine))
            assert writes == 3  # a piece per block (RESTORE_PIECES)
        assert np.array_equal(got["native"][0], reference)
        assert np.array_equal(got["numpy"][0], reference)
        assert got["native"][1] == got["numpy"][1]
    finally:
        engine.close()


def test_a_harvest_past_the_staging_buffer_goes_in_pieces(smollm2_path):
    """Blocks whose blob would outgrow the staging buffer are read in pieces that fit it;
    a block larger than the buffer alone is read into fresh memory, which stays alive
    until its copy-out on a copy thread ran. The stored bytes are those of one read."""
    from concurrent.futures import ThreadPoolExecutor

    engine = make_engine(smollm2_path, kvmem=KVMemConfig(budget=2048, gen_reserve=256))
    transfer = engine.session.transfer
    try:
        tokens = filler_tokens(engine, 4 * 128 + 10, seed=16)
        engine.reset()
        engine.teacher_force(tokens[:-1], [tokens[-1]])
        want = _stored(engine)
        one_block = 8 + kv_part_nbytes(transfer.layout, 128)
        transfer.copier = ThreadPoolExecutor(2)
        for limit, reads in ((2 * one_block, 2), (one_block // 2, 3)):
            transfer.staging = StagingBuffer(host_buffer_allocator(), limit)
            transfer.profile.clear()
            result = transfer.harvest([1, 2, 3])
            transfer.flush()
            assert result.block_ids == (1, 2, 3) and result.blocks == 3
            assert transfer.profile.paths[TransferPath.STATE_GET].calls == reads
            assert _stored(engine) == want
            transfer.staging.close()
    finally:
        engine.close()


def test_a_harvest_batch_split_across_the_staging_buffer_stays_bit_exact(smollm2_path):
    """`--kvmem-harvest-tokens`: the blocks of two prefill chunks wait on the GPU and go to
    the host in one batch; with a staging buffer of one block's blob that batch is read in
    one piece per block. The stored bytes equal those of harvesting each chunk's blocks at
    once through a buffer that holds them all."""
    kvmem = KVMemConfig(budget=2048, gen_reserve=256, harvest_tokens=0)
    tokens_at_once = make_engine(smollm2_path, cache="q8_0", kvmem=kvmem)
    try:
        tokens = filler_tokens(tokens_at_once, 7 * 128 + 10, seed=17)
        tokens_at_once.reset()
        tokens_at_once.teacher_force(tokens[:-1], [tokens[-1]])
        reads = tokens_at_once.session.transfer.profile.paths[TransferPath.STATE_GET].calls
        want = _stored(tokens_at_once)
        one_block = 8 + kv_part_nbytes(tokens_at_once.session.transfer.layout, 128)
    finally:
        tokens_at_once.close()
    assert reads == 3  # chunks of 512 tokens: the first block alone (layout), 3 blocks, 3
    batched = KVMemConfig(budget=2048, gen_reserve=256, harvest_tokens=5 * 128)
    engine = make_engine(smollm2_path, cache="q8_0", kvmem=batched)
    transfer = engine.session.transfer
    try:
        transfer.staging = StagingBuffer(host_buffer_allocator(), one_block)
        engine.reset()
        engine.teacher_force(tokens[:-1], [tokens[-1]])
        # one batch of the 7 complete blocks after the second chunk, a read per block
        assert transfer.profile.paths[TransferPath.STATE_GET].calls == 7
        assert engine.session.window.waiting == []
        assert _stored(engine) == want
        transfer.staging.close()
    finally:
        engine.close()


def test_a_restore_built_ahead_of_blocks_stored_again_is_not_used(smollm2_path):
    """A blob built ahead holds the blocks as they were stored when the build started: a
    block stored again since (a cut history prefilled anew, a conversation loaded) makes
    the restore build its own, from the store as it is now."""
    engine = make_engine(smollm2_path, kvmem=KVMemConfig(budget=2048, gen_reserve=256))
    session, transfer = engine.session, engine.session.transfer
    try:
        prompt, token, reference = _never_evicted(engine, seed=19)
        paths = transfer.profile.paths
        session.ctx.seq_rm(0, len(prompt), -1)
        session.window.evict([1, 2, 3])
        assert transfer.prepare([1, 2, 3])
        transfer.store.put(transfer.store.get(2))  # the same bytes, stored again
        transfer.profile.clear()
        stats = TurnStats()
        stats.add(session.window.restore({1: 128, 2: 256, 3: 384}))
        assert (stats.stage_in_blocks, stats.built_ahead_blocks) == (3, 0)
        assert (paths[TransferPath.STATE_BUILD].calls, paths[TransferPath.AHEAD_WAIT].calls) == (
            3,
            0,
        )
        session.ctx.decode([token], len(prompt), [True])
        assert np.array_equal(session.ctx.logits(-1), reference)
    finally:
        engine.close()


def _stream_stage_ins(trace: io.StringIO) -> int:
    """Blocks the prefill's stream restored in the turn just traced (and clear the trace)."""
    lines = [x for x in trace.getvalue().splitlines() if x.startswith("KVMEM_STREAM ")]
    trace.seek(0)
    trace.truncate()
    fields = [dict(f.split("=", 1) for f in x.split()[1:]) for x in lines]
    return sum(len(f["stage_in"].split(",")) for f in fields if f["stage_in"] != "-")


def _three_turns(path: str, ahead: bool) -> list[tuple[np.ndarray, int, int, int]]:
    """Three over-budget turns, each prompt extending the last: (logits of the 3 tokens
    after it, blocks staged in, of them built ahead, of them by the prefill's stream)."""
    # a budget/2 stream: the reselection leaves some of it out, for the next turn to restore
    kvmem = KVMemConfig(budget=1024, gen_reserve=256, stream_tokens=512, trace=True)
    trace = io.StringIO()
    engine = make_engine(path, n_ctx=2048, cache="q8_0", kvmem=kvmem, trace=trace)
    try:
        if not ahead:
            engine.session.transfer.ahead.close()
            engine.session.transfer.ahead = None
        tokens = filler_tokens(engine, 1700, seed=23)
        out = []
        for n in (1300, 1500, 1690):
            logits = engine.teacher_force(tokens[:n], tokens[n : n + 3])
            st = engine.last_turn
            out.append(
                (logits, st.stage_in_blocks, st.built_ahead_blocks, _stream_stage_ins(trace))
            )
        return out
    finally:
        engine.close()


def test_the_next_turns_stream_restore_is_built_between_turns(smollm2_path):
    """At a turn's end the window builds, off the next turn's path, the blobs its first
    prefill chunk will restore (the stream window the reselection left out), for a turn
    going on from the frontier. The next turn restores exactly those without a build of
    its own (the other stage-in is the reselection's), and every logit equals the direct
    path's."""
    built = _three_turns(smollm2_path, ahead=True)
    direct = _three_turns(smollm2_path, ahead=False)
    # compact (the default) moves the sink too, so it leaves the GPU at the next turn's
    # start and is one of the stream's restores (under gather: (2, 1, 1) and (5, 3, 3))
    assert [x[1:] for x in built] == [(1, 0, 0), (3, 2, 2), (6, 4, 4)]
    assert [x[1:] for x in direct] == [(1, 0, 0), (3, 0, 2), (6, 0, 4)]
    for (got, *_), (want, *_) in zip(built, direct, strict=True):
        assert np.array_equal(got, want)


def test_the_next_turns_restore_is_built_beside_the_generation(smollm2_path, monkeypatch):
    """With `--kvmem-restore-ahead generation`, once the prefill sets the frontier the window
    starts building the next turn's stream restore while the turn still generates; the
    turn's end predicts the same blocks and keeps that build (one build, not a second).
    With `turn-end` it starts at the turn's end. Either way the next turn restores exactly
    it."""
    builds: list[tuple[int, ...]] = []  # the blocks of every build started, in order
    start = RestoreAhead.start

    def spy(self, layout, pieces, versions):
        builds.append(tuple(b.block_id for piece in pieces for b in piece))
        return start(self, layout, pieces, versions)

    monkeypatch.setattr(RestoreAhead, "start", spy)
    for mode in RestoreAheadMode:
        during, after, second = _restore_built_ahead(smollm2_path, mode, builds)
        assert during == (after if mode is RestoreAheadMode.GENERATION else ()), mode
        assert second == [after] and len(after) == 4, mode


def _restore_built_ahead(smollm2_path, mode, builds):
    """Two turns (the second's prefill sets the frontier) and a third going on from it:
    the blocks being built at the second turn's first token and at its end, and the builds
    it started. The third turn restores exactly the blocks built for it."""
    kvmem = KVMemConfig(
        budget=1024, gen_reserve=256, stream_tokens=512, trace=True, restore_ahead=mode
    )
    trace = io.StringIO()
    engine = make_engine(smollm2_path, n_ctx=2048, cache="q8_0", kvmem=kvmem, trace=trace)
    ahead = engine.session.transfer.ahead
    try:
        tokens = filler_tokens(engine, 1700, seed=23)
        list(engine.generate(tokens[:1300], sampling=GREEDY, max_tokens=3, ignore_eos=True))
        first = len(builds)
        turn = engine.generate(tokens[:1500], sampling=GREEDY, max_tokens=3, ignore_eos=True)
        next(turn)  # the first token: with `generation` the next turn's build is under way
        during = ahead.building
        list(turn)
        after = ahead.building  # with `generation`: kept, not rebuilt (one build a turn)
        second = builds[first:]
        _stream_stage_ins(trace)  # (clears the trace)
        engine.teacher_force(tokens[:1690], tokens[1690:1693])
        assert engine.last_turn.built_ahead_blocks == _stream_stage_ins(trace) == 4
        return during, after, second
    finally:
        engine.close()
