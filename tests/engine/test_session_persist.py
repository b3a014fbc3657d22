"""A stored session, loaded by a new engine: tokens, summaries, window and logits (SmolLM2)."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import numpy as np

from kvmem.config import KVMemConfig

from .helpers import GREEDY, filler_tokens, make_engine

BT = 128


def config(store: Path) -> KVMemConfig:
    return KVMemConfig(budget=512, gen_reserve=256, disk_dir=str(store), host_mib=1, trace=True)


def test_restart_restores_tokens_summaries_and_logits(smollm2_path: str, tmp_path: Path) -> None:
    store = tmp_path / "store"
    first = make_engine(smollm2_path, kvmem=config(store))
    prompt = filler_tokens(first, 700)  # 5 complete blocks + 60 open tokens; over the budget
    list(first.generate(prompt, sampling=GREEDY, max_tokens=1))
    assert first.disk_store is not None and first.disk_store.flush(60)
    index = first.session.index
    assert index is not None
    ids = list(range(5))
    means, (lo, hi) = index.means(ids), index.bounds(ids)
    probe = prompt + filler_tokens(first, 40, seed=3)[1:]
    frontier = first.session.frontier  # the prompt was over the budget: a chosen window
    assert frontier is not None and 0 < frontier < 5 * BT
    first.close()
    damaged = tmp_path / "damaged"
    shutil.copytree(store, damaged)  # the same store, for the damaged-summary restart

    trace = io.StringIO()
    second = make_engine(smollm2_path, kvmem=config(store), trace=trace)
    s = second.session
    assert s.table.n_tokens == 5 * BT and s.table.tokens == prompt[: 5 * BT]
    assert s.table.host_blocks() == (0, 1, 2, 3) + (4,)
    assert s.table.gpu_blocks() == (0, 2, 3, 4)  # the sink + the most recent within 512
    assert s.index is not None and s.index.block_ids() == tuple(ids)
    assert np.array_equal(s.index.means(ids), means)  # read from the .sum files
    assert all(np.array_equal(a, b) for a, b in zip(s.index.bounds(ids), (lo, hi), strict=True))
    assert "KVMEM_LOAD tokens=640 blocks=5 stored_blocks=5 recomputed_blocks=0" in trace.getvalue()
    assert s.frontier == frontier  # from the manifest: the tokens from it are recomputed
    logits = second.teacher_force(probe, probe[-1:])
    assert second.last_turn.cached_tokens == frontier
    assert second.last_turn.reprocessed_tokens == 5 * BT - frontier
    second.close()

    # a damaged summary file is recomputed from the block's keys, to the same values
    summary = damaged / "blocks" / "b00000003.sum"
    summary.write_bytes(summary.read_bytes()[:-1] + b"\x00")
    third = make_engine(smollm2_path, kvmem=config(damaged))
    assert third.session.index is not None
    assert np.array_equal(third.session.index.means(ids), means)
    again = third.teacher_force(probe, probe[-1:])
    assert third.last_turn.cached_tokens == frontier
    np.testing.assert_array_equal(again, logits)
    third.close()
