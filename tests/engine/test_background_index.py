"""BackgroundIndex: summaries computed on a worker thread, read back exactly in order."""

from __future__ import annotations

import threading

import numpy as np

from kvmem.engine.query.background_index import BackgroundIndex
from kvmem.memory.ggml_types import GgmlType
from kvmem.memory.retrieval_index import BlockKeys, KeyGeometry, RetrievalIndex
from kvmem.memory.rope import RopeParams, RopeType

GEOMETRY = KeyGeometry(2, 2, 8, GgmlType.F32, RopeParams(RopeType.NEOX, n_rot=8), 0)


def _block(block_id: int, seed: int) -> BlockKeys:
    rng = np.random.default_rng(seed)
    positions = np.arange(block_id * 4, block_id * 4 + 4, dtype=np.int32)  # [4]
    rows = [
        rng.standard_normal((4, GEOMETRY.n_embd_k)).astype(np.float32).view(np.uint8)
        for _ in range(GEOMETRY.n_layer)
    ]  # per layer: [4, n_embd_k * 4] bytes
    return BlockKeys(block_id, positions, rows)


def test_background_index_matches_synchronous_index() -> None:
    sync = RetrievalIndex(GEOMETRY, [0, 1])
    background = BackgroundIndex(GEOMETRY, [0, 1], workers=1)
    try:
        first = [_block(0, 1), _block(1, 2), _block(2, 3)]
        replacement = [_block(1, 9)]  # a re-harvest of block 1 replaces its summary
        for index in (sync, background):
            index.add_blocks(first)
            index.add_blocks(replacement)
        assert 1 in background  # reads wait for the pending summaries
        assert background.block_ids() == (0, 1, 2)
        np.testing.assert_array_equal(background.means([0, 1, 2]), sync.means([0, 1, 2]))
        background.add_blocks([_block(3, 4)])
        background.remove([0, 3])
        assert background.block_ids() == (1, 2)
        assert len(background) == 2
    finally:
        background.close()


def test_zero_workers_is_synchronous() -> None:
    index = BackgroundIndex(GEOMETRY, [1], workers=0)
    index.add(5, *(lambda b: (b.positions, b.k_rows))(_block(5, 5)))
    assert super(BackgroundIndex, index).block_ids() == (5,)  # stored without a flush
    index.close()


class _GatedIndex(BackgroundIndex):
    """Summaries of block 9 wait for `gate`: a batch still being computed."""

    def __init__(self, workers: int) -> None:
        super().__init__(GEOMETRY, [0, 1], workers=workers)
        self.gate = threading.Event()

    def summarize(self, blocks):  # type: ignore[no-untyped-def]
        if any(b.block_id == 9 for b in blocks):
            assert self.gate.wait(10)
        return super().summarize(blocks)


def test_a_batch_is_split_per_worker_and_scoring_waits_only_for_its_blocks() -> None:
    """Six blocks on three workers are three pending slices of two. Scoring blocks 0..5
    does not wait for a later batch still being computed (block 9), and reads exactly
    what the synchronous index holds for them; a full read then waits for block 9."""
    sync = RetrievalIndex(GEOMETRY, [0, 1])
    index = _GatedIndex(workers=3)
    try:
        blocks = [_block(b, 10 + b) for b in range(6)]
        index.add_blocks(blocks)
        sync.add_blocks(blocks)
        assert [ids for ids, _ in index._pending] == [[0, 1], [2, 3], [4, 5]]
        index.add_blocks([_block(9, 19)])
        table = index.score_table(list(range(6)))
        assert sorted(table.block_ids()) == list(range(6))  # block 9 still pending
        assert [ids for ids, _ in index._pending] == [[9]]
        np.testing.assert_array_equal(
            table.stats(list(range(6))), sync.score_table().stats(list(range(6)))
        )
        index.gate.set()
        assert 9 in index and index.block_ids() == (0, 1, 2, 3, 4, 5, 9)
    finally:
        index.gate.set()
        index.close()
