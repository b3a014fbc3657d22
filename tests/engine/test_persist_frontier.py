"""The session's frontier survives a restart (issue 14's `reprocessed` frontier, SmolLM2).

A prompt over the budget leaves a frontier: the tokens from it saw a chosen window, and
the next turn recomputes them. The manifest records it, so a restarted engine reuses
exactly what the uninterrupted one reuses and continues with the same greedy tokens.
(Logits agree to about 0.6, not bit for bit: a restored window is not built the way the
uninterrupted turn built it; with or without the frontier, the greedy tokens are equal.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvmem.config import KVMemConfig

from .helpers import GREEDY, filler_tokens, make_engine

pytestmark = pytest.mark.slow

BT = 128


def config(store: Path) -> KVMemConfig:
    return KVMemConfig(budget=512, gen_reserve=256, disk_dir=str(store))


def test_a_restart_recomputes_from_the_stored_frontier(smollm2_path: str, tmp_path: Path) -> None:
    uninterrupted = make_engine(smollm2_path, kvmem=config(tmp_path / "a"))
    prompt = filler_tokens(uninterrupted, 700)  # 5 complete blocks, over the budget
    list(uninterrupted.generate(prompt, sampling=GREEDY, max_tokens=1))
    frontier = uninterrupted.session.frontier
    assert frontier is not None and 0 < frontier < 5 * BT
    probe = prompt + filler_tokens(uninterrupted, 30, seed=5)[1:]
    expected = uninterrupted.teacher_force(probe, probe[-1:])
    reference = uninterrupted.last_turn
    follow = probe + [int(expected[0].argmax())]
    greedy = list(uninterrupted.generate(follow, sampling=GREEDY, max_tokens=8))
    uninterrupted.close()
    assert reference.cached_tokens == frontier

    first = make_engine(smollm2_path, kvmem=config(tmp_path / "b"))
    list(first.generate(prompt, sampling=GREEDY, max_tokens=1))
    assert first.session.frontier == frontier
    first.close()  # the writer finishes: the manifest names 5 blocks and the frontier
    restarted = make_engine(smollm2_path, kvmem=config(tmp_path / "b"))
    assert restarted.session.table.n_tokens == 5 * BT
    assert restarted.session.frontier == frontier
    got = restarted.teacher_force(probe, probe[-1:])
    turn = restarted.last_turn
    assert turn.cached_tokens == reference.cached_tokens == frontier
    assert turn.reprocessed_tokens == 5 * BT - frontier  # the open block was not stored
    assert int(got[0].argmax()) == int(expected[0].argmax())
    assert list(restarted.generate(follow, sampling=GREEDY, max_tokens=8)) == greedy
    restarted.close()
