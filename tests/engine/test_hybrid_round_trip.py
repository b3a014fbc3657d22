"""Attention blocks of a hybrid (tiny synthetic qwen35) harvested through a staging
sequence, evicted, and restored through another one with the codec: the logits equal the
never-evicted ones exactly, and sequence 0's recurrent state is never touched."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from kvmem.engine.hybrid.hybrid_codec import (
    RecurrentState,
    build_hybrid_state,
    parse_hybrid_state,
)
from kvmem.engine.hybrid.recurrent_state import read_recurrent, snapshot_recurrent
from kvmem.engine.llama.batch_rows import HARVEST_SEQ, RESTORE_SEQ
from kvmem.engine.llama.context import ContextSettings, LlamaContext
from kvmem.engine.llama.model import LlamaModel
from kvmem.engine.transfer.state_codec import split_blocks

from .hybrid_models import tiny_hybrid_path  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow

BLOCK = 16
TOKENS = [1 + (7 * i) % 900 for i in range(48)]
P0, P1 = 16, 32  # the block taken out


@pytest.fixture(scope="module")
def model(tiny_hybrid_path: Path) -> Iterator[LlamaModel]:  # noqa: F811
    m = LlamaModel(str(tiny_hybrid_path))
    yield m
    m.close()


def new_ctx(model: LlamaModel) -> LlamaContext:
    ctx = LlamaContext(model, ContextSettings(n_cells=128, n_threads=1))
    ctx.decode(TOKENS[:40], 0, [False] * 40)
    return ctx


def finish(ctx: LlamaContext) -> np.ndarray:
    ctx.decode(TOKENS[40:], 40, [False] * 7 + [True])
    return ctx.logits(-1)  # [n_vocab]


def harvest(ctx: LlamaContext):
    ctx.seq_cp(0, HARVEST_SEQ, P0, P1)
    state = parse_hybrid_state(bytes(ctx.get_state(HARVEST_SEQ)), cell_ext=True)
    ctx.seq_rm(HARVEST_SEQ, -1, -1)
    return state


def restore(ctx: LlamaContext, state, recurrent: RecurrentState) -> None:
    blocks = split_blocks(state.attn, BLOCK)
    ctx.set_state(build_hybrid_state(state.attn.layout, blocks, RESTORE_SEQ, recurrent), 2)
    ctx.seq_cp(RESTORE_SEQ, 0, P0, P1)
    ctx.seq_rm(RESTORE_SEQ, -1, -1)


def test_round_trip_keeps_logits_and_recurrent_state(model: LlamaModel) -> None:
    reference = new_ctx(model)
    ctx = new_ctx(model)
    evicted = new_ctx(model)
    try:
        expected = finish(reference)
        before = read_recurrent(ctx)
        state = harvest(ctx)
        assert state.attn.positions.tolist() == list(range(P0, P1))
        assert state.recurrent.same_as(before)  # seq_cp shares seq 0's recurrent cell
        blocks = split_blocks(state.attn, BLOCK)
        assert [b.block_id for b in blocks] == [1]
        assert blocks[0].ext is not None and blocks[0].ext[:, 2].tolist() == TOKENS[P0:P1]
        ctx.seq_rm(0, P0, P1)  # ends before the recurrent tail: the state stays
        assert read_recurrent(ctx).same_as(before)
        restore(ctx, state, snapshot_recurrent(ctx).parse())
        assert read_recurrent(ctx).same_as(before)  # the staging handed back the same state
        got = parse_hybrid_state(bytes(ctx.get_state(0)), cell_ext=True)
        assert sorted(got.attn.positions.tolist()) == list(range(40))
        np.testing.assert_array_equal(finish(ctx), expected)  # flash attention: exact

        evicted.seq_rm(0, P0, P1)
        assert not np.array_equal(finish(evicted), expected)  # the block matters
    finally:
        for c in (reference, ctx, evicted):
            c.close()


def test_staging_blob_with_another_recurrent_part_clobbers_seq0(model: LlamaModel) -> None:
    """The pitfall the codec's `recurrent` argument exists for."""
    ctx = new_ctx(model)
    try:
        before = read_recurrent(ctx)
        state = harvest(ctx)
        ctx.seq_rm(0, P0, P1)
        other = parse_hybrid_state(bytes(ctx.get_state(HARVEST_SEQ)), cell_ext=True)
        assert other.recurrent.positions.size == 0  # the emptied staging sequence
        restore(ctx, state, other.recurrent)
        assert not read_recurrent(ctx).same_as(before)
    finally:
        ctx.close()
