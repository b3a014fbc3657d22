"""ChunkRunner.run_pieces: a prompt chunk decoded in its ubatches, with work after each
(the prefill records the piece and the query work ahead polls), is the decode of the
whole chunk bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from kvmem.config import KVMemConfig

from .helpers import filler_tokens, make_engine


@pytest.mark.parametrize(("cache", "flash_attn"), [("q8_0", True), ("f16", False)])
def test_a_chunk_decoded_in_its_ubatches_equals_the_whole_chunk(smollm2_path, cache, flash_attn):
    kvmem = KVMemConfig(budget=1024, gen_reserve=256)
    engine = make_engine(smollm2_path, cache=cache, kvmem=kvmem, flash_attn=flash_attn)
    try:
        runner, ctx = engine.session.runner, engine.session.ctx
        assert (runner.grid.ubatch, runner.capture is not None) == (128, True)
        tokens = filler_tokens(engine, 300 + 350, seed=5)
        history, chunk = tokens[:300], tokens[300:]

        def decode(split: bool) -> tuple[np.ndarray, dict[int, np.ndarray], list[int]]:
            engine.reset()
            runner.run(history, 0, False, False, False)
            seen: list[tuple[int, bool, int]] = []  # (piece, last, tokens in the context)
            after = lambda p, end: seen.append((len(p), end, ctx.seq_pos_max() + 1))  # noqa: E731
            if split:
                rows = runner.run_pieces(chunk, 300, True, True, after)
            else:
                rows = runner.run(chunk, 300, False, True, True)
            return ctx.logits(-1).copy(), rows, seen

        whole_logits, whole_rows, _ = decode(split=False)
        logits, rows, seen = decode(split=True)
        assert seen == [
            (128, False, 428),
            (128, False, 556),
            (94, True, 650),
        ]  # the ubatches from the chunk's start
        assert np.array_equal(logits, whole_logits)
        assert sorted(rows) == sorted(whole_rows) and rows
        for layer, want in whole_rows.items():
            assert rows[layer].shape == want.shape == (350, *want.shape[1:])
            assert np.array_equal(rows[layer], want)
    finally:
        engine.close()
