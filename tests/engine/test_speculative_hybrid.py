"""Verified drafts on a hybrid (tiny synthetic qwen35): the output equals plain decoding and
the recurrent state folds in only the accepted tokens, with rollback planes (n_rs_seq) and
with the snapshot fallback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from kvmem.bench.lookup_drafts import drafted_loop, plain_loop
from kvmem.engine.hybrid.hybrid_codec import HybridSeqState, parse_hybrid_state
from kvmem.engine.llama.context import ContextSettings, LlamaContext
from kvmem.engine.llama.host_staging import StagingBuffer
from kvmem.engine.llama.model import LlamaModel
from kvmem.sampling import SamplingParams

from .hybrid_models import tiny_hybrid_path  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow

GREEDY = SamplingParams(temperature=0.0)
PROMPT = [1, 50, 60, 70, 80, 90, 100, 110, 50, 60, 70]
N_NEW = 40


@pytest.fixture(scope="module")
def model(tiny_hybrid_path: Path) -> Iterator[LlamaModel]:  # noqa: F811
    m = LlamaModel(str(tiny_hybrid_path))
    yield m
    m.close()


@pytest.fixture(scope="module")
def plain(model: LlamaModel) -> tuple[list[int], HybridSeqState]:
    ctx = LlamaContext(model, ContextSettings(n_cells=128, n_threads=1))
    try:
        tokens = plain_loop(ctx, PROMPT, N_NEW, GREEDY).tokens
        return tokens, parse_hybrid_state(bytes(ctx.get_state(0)), cell_ext=True)
    finally:
        ctx.close()


@pytest.mark.parametrize(
    ("n_rs_seq", "staged"),
    [(0, False), (0, True), (8, False)],
    ids=["snapshot", "snapshot-staged", "rollback"],
)
def test_hybrid_greedy_with_drafts_equals_plain(
    model: LlamaModel, plain: tuple[list[int], HybridSeqState], n_rs_seq: int, staged: bool
) -> None:
    expected, plain_state = plain
    assert len(expected) == N_NEW

    def oracle(_history: list[int], step: int) -> list[int]:  # every 4th draft token wrong
        draft = expected[step : step + 5]
        return [t if (step + i) % 4 else (t + 1) % 1000 for i, t in enumerate(draft)]

    ctx = LlamaContext(model, ContextSettings(n_cells=128, n_threads=1, n_rs_seq=n_rs_seq))
    try:
        assert ctx.n_rs_seq == n_rs_seq  # qwen35 supports rollback planes
        # the snapshots in one reused buffer (pageable here; page-locked on a GPU build)
        staging = StagingBuffer(None, limit_bytes=1 << 30) if staged else None
        run = drafted_loop(ctx, PROMPT, N_NEW, oracle, GREEDY, staging=staging)
        state = parse_hybrid_state(bytes(ctx.get_state(0)), cell_ext=True)
        if staging is not None:
            assert staging.capacity > 0  # every rejected step's snapshot went through it
            staging.close()
    finally:
        ctx.close()
    assert run.tokens == expected
    assert 0 < run.accepted < run.drafted
    # the cache after the last step: the prompt and every token but the last, as plain
    # decoding left it; a rejected token folded into the recurrent state would show here
    assert state.attn.positions.tolist() == list(range(len(PROMPT) + N_NEW - 1))
    assert state.recurrent.positions.tolist() == [len(PROMPT) + N_NEW - 2]
    for got, want in zip(
        state.recurrent.r + state.recurrent.s,
        plain_state.recurrent.r + plain_state.recurrent.s,
        strict=True,
    ):
        np.testing.assert_allclose(got.view(np.float32), want.view(np.float32), atol=1e-6)
