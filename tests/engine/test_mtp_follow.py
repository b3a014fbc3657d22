"""The MTP draft context follows the target at no cost while the draft gate keeps steps
plain, and its KV follows the window (the same blocks at the same positions), on the tiny
synthetic qwen35 with one nextn layer (engine/spec/mtp_draft.py, engine/spec/mtp_blocks.py).

- While the gate is closed, a step adds its row to the drafter's backlog only: the draft
  context decodes nothing, also when the step completes a block the target harvests (its
  copy waits for the next catch-up). The next draft decodes the whole backlog with its
  first draft row in one batch.
- Over budget, after reselections that restore blocks into the target, the draft context
  holds the same blocks' cells at the same positions, byte for byte what it computed for
  them before they were evicted; greedy output is the output without drafts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvmem.engine.engine import Engine
from kvmem.engine.spec.draft_gate import DraftGate
from kvmem.engine.transfer.state_codec import parse_state
from kvmem.spec_config import SpecConfig, SpecType

from .helpers import GREEDY
from .test_mtp_spec import OVER, UNDER, conversation, engine, mtp_paths, plain_outputs, tokens

__all__ = ["mtp_paths", "plain_outputs"]  # fixtures

pytestmark = pytest.mark.slow

GATED = SpecConfig(type=SpecType.MTP, n_max=3)  # the gate on, as by default


class ScriptedGate(DraftGate):
    """Drafts at the given steps only; records, per step, the draft context's decodes so
    far and the history length when the step began."""

    def __init__(self, e: Engine, draft_steps: set[int]) -> None:
        super().__init__()
        self.e = e
        self.draft_steps = draft_steps
        self.seen: list[tuple[int, int]] = []  # (draft decodes so far, n_tokens)

    def wants_draft(self) -> bool:
        self.steps += 1
        assert self.e.mtp is not None
        self.seen.append((self.e.mtp.n_decodes, self.e.session.table.n_tokens))
        return self.steps in self.draft_steps


def test_a_closed_gate_step_decodes_nothing_on_the_draft_context(
    mtp_paths: dict[str, Path], plain_outputs: dict
) -> None:
    e = engine(mtp_paths["random"], OVER, GATED)
    try:
        gate = ScriptedGate(e, draft_steps={40})
        assert e.session.spec is not None
        e.session.spec.gate = gate
        prompt = tokens(400, seed=3)[:200]
        out = list(e.generate(prompt, sampling=GREEDY, max_tokens=90))
        seen = [*gate.seen, (e.mtp.n_decodes, e.session.table.n_tokens)]
        first_gen_block = 200 // OVER.block_tokens  # completed by the first steps
        deferred_copied = first_gen_block in e.mtp.blocks.store
        backlog_dropped = e.mtp.backlog.dropped_rows
    finally:
        e.close()
    assert out == plain_outputs["random", "over"][0][0]
    assert backlog_dropped == 0
    bt = OVER.block_tokens
    for step, ((d0, n0), (d1, n1)) in enumerate(zip(seen, seen[1:], strict=False), start=1):
        if step == 40:  # the backlog and the first draft row in one batch, then 2 draft rows
            assert d1 - d0 == 3, (step, n0, n1)
        else:  # a plain step, block harvests included: nothing
            assert d1 - d0 == 0, (step, n0, n1)
    assert seen[-1][1] // bt - seen[0][1] // bt >= 2  # blocks completed while closed
    assert deferred_copied  # the blocks completed before the probe were copied at it


def draft_rows(e: Engine) -> dict[int, bytes]:
    """The draft context's cells: position -> the nextn layer's K and V row bytes."""
    assert e.mtp is not None
    state = parse_state(bytes(e.mtp.ctx.get_state(0)), cell_ext=True)
    (k,), (v,) = state.k, state.v  # uint8 [n_cells, row_bytes]: the one nextn layer
    order = np.asarray(state.positions).tolist()
    return {p: k[i].tobytes() + v[i].tobytes() for i, p in enumerate(order)}


def test_restored_blocks_come_back_into_the_draft_context_at_their_positions(
    mtp_paths: dict[str, Path], plain_outputs: dict
) -> None:
    e = engine(mtp_paths["random"], OVER, GATED)
    computed: dict[int, bytes] = {}  # position -> the draft context's K/V when copied
    restored: list[int] = []
    assert e.mtp is not None
    drafter = e.mtp
    bt = OVER.block_tokens
    harvest, restore = drafter.blocks.harvest, drafter.after_restore

    def spy_harvest(block_ids, block_tokens, backlog_from) -> None:
        harvest(block_ids, block_tokens, backlog_from)
        rows = draft_rows(e)  # read from the draft context itself, not from the copies
        for b in block_ids:
            if b in drafter.blocks.store:  # copied now: the cells it computed
                for p in range(b * bt, (b + 1) * bt):
                    computed[p] = rows[p]

    def spy_restore(starts, block_tokens) -> None:
        restore(starts, block_tokens)
        restored.extend(b for b in starts if b in drafter.blocks.store)

    drafter.blocks.harvest, drafter.after_restore = spy_harvest, spy_restore
    try:
        outs, stats = conversation(e)
        rows = draft_rows(e)
        on_gpu = set(e.session.table.gpu_blocks())
        n_copies = len(drafter.blocks.store)
    finally:
        e.close()
    assert outs == plain_outputs["random", "over"][0]
    assert restored and drafter.blocks.restored == len(restored)
    assert n_copies > 0
    back = sorted(set(restored) & on_gpu)  # restored and still in the window at the end
    assert back, (restored, on_gpu)
    for b in back:
        for p in range(b * bt, (b + 1) * bt):
            assert rows[p] == computed[p], (b, p)  # the cell exists, its bytes exact
    # every position the draft context holds below the last turn's tail is a window block's
    assert {p // bt for p in rows} - on_gpu <= {max(rows) // bt}


def test_the_drafter_copies_exactly_the_blocks_the_target_harvests(
    mtp_paths: dict[str, Path],
) -> None:
    """Under budget: every complete block is harvested by the target and copied by the
    drafter (the same ids, the nextn layer's rows only), and nothing is restored."""
    e = engine(mtp_paths["random"], UNDER, GATED)
    try:
        list(e.generate(tokens(200), sampling=GREEDY, max_tokens=40))
        assert e.mtp is not None
        copies = e.mtp.blocks.store
        target = e.session.transfer.store
        assert copies.block_ids() == target.block_ids() == tuple(range(240 // UNDER.block_tokens))
        assert e.mtp.blocks.restored == 0
        block = copies.get(0)
        assert len(block.k) == len(block.v) == 1 and block.positions.tolist() == list(range(32))
    finally:
        e.close()
