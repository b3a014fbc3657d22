"""--warmup (SmolLM2): one scratch decode of BOS and EOS on the main context at load, then
the memory cleared, before any stored session is restored; the history, the KV and the
restored session are as without it."""

from __future__ import annotations

import shutil
from pathlib import Path

import llama_cpp
import numpy as np

from kvmem.config import KVMemConfig

from .helpers import GREEDY, filler_tokens, make_engine


def test_warmup_decodes_bos_and_eos_then_leaves_everything_empty(smollm2_path: str) -> None:
    warm = make_engine(smollm2_path, n_ctx=512, warmup=True)
    cold = make_engine(smollm2_path, n_ctx=512)
    try:
        vocab = warm.model.vocab
        assert llama_cpp.llama_vocab_bos(vocab) >= 0 and llama_cpp.llama_vocab_eos(vocab) >= 0
        assert (warm.ctx.warmup_tokens, cold.ctx.warmup_tokens) == (2, 0)
        assert warm.ctx.seq_pos_max() == -1  # the KV is empty again
        assert warm.session.table.n_tokens == 0 and warm.session.table.tokens == []
        prompt = warm.tokenize("The capital of France is", add_special=True)
        tokens = [list(e.generate(prompt, sampling=GREEDY, max_tokens=6)) for e in (warm, cold)]
        assert tokens[0] == tokens[1] and len(tokens[0]) == 6
        assert warm.last_turn.cached_tokens == 0  # nothing of the warm-up was reused
    finally:
        warm.close()
        cold.close()


def test_warmup_runs_before_the_stored_session_is_restored(
    smollm2_path: str, tmp_path: Path
) -> None:
    def config(store: Path) -> KVMemConfig:
        return KVMemConfig(budget=512, gen_reserve=256, disk_dir=str(store), host_mib=1)

    first = make_engine(smollm2_path, kvmem=config(tmp_path / "a"))
    prompt = filler_tokens(first, 300)  # 2 complete blocks of 128 + 44 open tokens
    list(first.generate(prompt, sampling=GREEDY, max_tokens=1))
    assert first.disk_store is not None and first.disk_store.flush(60)
    probe = prompt + filler_tokens(first, 20, seed=3)[1:]
    first.close()
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    logits = []
    for store, warmup in ((tmp_path / "a", True), (tmp_path / "b", False)):
        engine = make_engine(smollm2_path, kvmem=config(store), warmup=warmup)
        try:
            assert engine.ctx.warmup_tokens == (2 if warmup else 0)
            assert engine.session.table.tokens == prompt[:256]  # restored whole
            logits.append(engine.teacher_force(probe, probe[-1:]))
            assert engine.last_turn.cached_tokens == 256
        finally:
            engine.close()
    np.testing.assert_array_equal(logits[0], logits[1])
