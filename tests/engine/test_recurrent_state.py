"""Recurrent-state snapshots on a hybrid (tiny synthetic qwen35): after tokens X, rewinding
to the snapshot taken before X gives back that state bit for bit, and decoding Y then gives
the logits of a fresh context that processed only the prefix and Y."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from kvmem.engine.hybrid.recurrent_state import (
    PARTIAL_ONLY,
    RecurrentCheckpoints,
    read_recurrent,
    restore_recurrent,
    rewind,
    snapshot_recurrent,
)
from kvmem.engine.llama.context import ContextSettings, LlamaContext
from kvmem.engine.llama.model import LlamaModel
from kvmem.errors import KVTransferError

from .hybrid_models import tiny_hybrid_path  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow

PREFIX = [1, 50, 60, 70, 80, 90]
X = [400, 401, 402, 403, 404]
Y = [700, 701, 702, 703]


@pytest.fixture(scope="module")
def model(tiny_hybrid_path: Path) -> Iterator[LlamaModel]:  # noqa: F811
    m = LlamaModel(str(tiny_hybrid_path))
    yield m
    m.close()


def new_ctx(model: LlamaModel) -> LlamaContext:
    return LlamaContext(model, ContextSettings(n_cells=128, n_threads=1))


def decode(ctx: LlamaContext, tokens: list[int], start: int) -> np.ndarray:
    ctx.decode(tokens, start, [False] * (len(tokens) - 1) + [True])
    return ctx.logits(-1)  # [n_vocab]


def test_rewind_after_x_equals_never_having_seen_x(model: LlamaModel) -> None:
    ctx = new_ctx(model)
    fresh = new_ctx(model)
    try:
        decode(ctx, PREFIX, 0)
        snap = snapshot_recurrent(ctx)
        assert snap.pos == len(PREFIX) - 1 and snap.seq_id == 0
        decode(ctx, X, len(PREFIX))
        after_x = read_recurrent(ctx)
        assert after_x.positions.tolist() == [len(PREFIX) + len(X) - 1]
        assert not after_x.same_as(snap.parse())  # X changed the state
        rewind(ctx, snap)
        assert read_recurrent(ctx).same_as(snap.parse())
        assert bytes(ctx.get_state(0, PARTIAL_ONLY)) == snap.blob.tobytes()  # bit for bit
        assert ctx.seq_pos_max(0) == len(PREFIX) - 1  # X's attention cells are gone
        logits = decode(ctx, Y, len(PREFIX))

        decode(fresh, PREFIX, 0)
        expected = decode(fresh, Y, len(PREFIX))
        np.testing.assert_array_equal(logits, expected)
        assert read_recurrent(ctx).same_as(read_recurrent(fresh))
        assert bytes(ctx.get_state(0)) == bytes(fresh.get_state(0))  # attention part too
    finally:
        ctx.close()
        fresh.close()


def test_restore_alone_keeps_attention_cells(model: LlamaModel) -> None:
    ctx = new_ctx(model)
    try:
        decode(ctx, PREFIX, 0)
        snap = snapshot_recurrent(ctx)
        decode(ctx, X, len(PREFIX))
        with pytest.raises(KVTransferError):  # the recurrent tail holds X: no partial removal
            ctx.seq_rm(0, len(PREFIX), -1)
        restore_recurrent(ctx, snap)
        assert read_recurrent(ctx).same_as(snap.parse())
        # the attention cells of X stay (rewind removes them); the recurrent tail is back
        # before X, so removing X's range now succeeds
        n_attn = len(PREFIX) + len(X)
        state = bytes(ctx.get_state(0))
        assert int.from_bytes(state[12:16], "little") == n_attn  # attention cell count
        ctx.seq_rm(0, len(PREFIX), -1)
        assert ctx.seq_pos_max(0) == len(PREFIX) - 1
        # the snapshot also restores into another sequence
        restore_recurrent(ctx, snap, seq=2)
        assert read_recurrent(ctx, 2).same_as(snap.parse())
    finally:
        ctx.close()


def test_checkpoints_resume_inside_the_history(model: LlamaModel) -> None:
    turns = [
        [1, 50, 60, 70, 80, 90, 100, 110],
        [200 + i for i in range(8)],
        [300 + i for i in range(8)],
    ]
    history = [t for turn in turns for t in turn]
    new = [500, 501, 502, 503]
    ctx = new_ctx(model)
    fresh = new_ctx(model)
    try:
        checkpoints = RecurrentCheckpoints(max_snapshots=2)
        start = 0
        for turn in turns:
            decode(ctx, turn, start)
            start += len(turn)
            checkpoints.take(ctx)
        assert checkpoints.positions == [15, 23]  # bounded: the oldest (7) was dropped
        checkpoints = RecurrentCheckpoints(max_snapshots=3)
        ctx.clear()
        start = 0
        for turn in turns:
            decode(ctx, turn, start)
            start += len(turn)
            checkpoints.take(ctx)
        assert checkpoints.positions == [7, 15, 23]
        # a new request agrees with the history up to position 12 (inside turn 2)
        resume_at = checkpoints.resume(ctx, keep=12)
        assert resume_at == 8 and checkpoints.positions == [7]
        assert read_recurrent(ctx).positions.tolist() == [7]
        decode(ctx, history[8:12], 8)
        logits = decode(ctx, new, 12)

        decode(fresh, history[:8], 0)
        decode(fresh, history[8:12], 8)
        np.testing.assert_array_equal(logits, decode(fresh, new, 12))
        assert read_recurrent(ctx).same_as(read_recurrent(fresh))

        # the fallback: no snapshot before the cut, the sequence starts over
        assert checkpoints.resume(ctx, keep=5) == 0
        assert ctx.seq_pos_max(0) == -1 and checkpoints.positions == []
    finally:
        ctx.close()
        fresh.close()
