"""Turn 2 processes only the new suffix; an edited earlier message reprocesses from there."""

from __future__ import annotations

import io
import re

import pytest

from kvmem.config import KVMemConfig

from .helpers import GREEDY, filler_tokens, make_engine


@pytest.fixture(scope="module")
def traced(smollm2_path):
    trace = io.StringIO()
    engine = make_engine(
        smollm2_path,
        n_ctx=4096,
        kvmem=KVMemConfig(budget=1024, gen_reserve=256, trace=True),
        trace=trace,
    )
    yield engine, trace
    engine.close()


def _last_prefill(trace: io.StringIO) -> dict[str, str]:
    line = [ln for ln in trace.getvalue().splitlines() if ln.startswith("KVMEM_PREFILL")][-1]
    return dict(re.findall(r"(\w+)=(\S+)", line))


def test_three_turns_reuse_history(traced):
    engine, trace = traced
    engine.reset()
    base = filler_tokens(engine, 2400, seed=5)
    turn1 = base[:1500]
    out1 = list(engine.generate(turn1, sampling=GREEDY, max_tokens=16, ignore_eos=True))
    assert _last_prefill(trace)["reused"] == "0"
    # the history holds the prompt and every generated token but the last (never decoded)
    assert engine.session.table.n_tokens == len(turn1) + len(out1) - 1

    turn2 = turn1 + out1 + base[1500:1900]
    list(engine.generate(turn2, sampling=GREEDY, max_tokens=16, ignore_eos=True))
    stats = engine.last_turn
    # over budget, the replayed question and the answer saw the chosen window: a fresh
    # server would compute them against the stream window, so they are computed again
    history = len(turn1) + len(out1) - 1
    assert stats.reprocessed_tokens > 0
    assert stats.cached_tokens + stats.reprocessed_tokens == history
    assert stats.prefill_tokens == len(turn2) - stats.cached_tokens
    rec = _last_prefill(trace)
    assert rec["reused"] == str(stats.cached_tokens)
    assert rec["new"] == str(401 + stats.reprocessed_tokens)

    turn3 = turn2 + base[1900:2000]
    list(engine.generate(turn3, sampling=GREEDY, max_tokens=8, ignore_eos=True))
    assert engine.last_turn.prefill_tokens == len(turn3) - engine.last_turn.cached_tokens
    assert engine.last_turn.cached_tokens >= len(turn2) - 256  # at most the replayed tail


def test_edit_earlier_message_reprocesses_from_divergence(traced):
    engine, trace = traced
    engine.reset()
    base = filler_tokens(engine, 2000, seed=6)
    prompt = base[:1800]
    list(engine.generate(prompt, sampling=GREEDY, max_tokens=4, ignore_eos=True))
    edited = list(prompt)
    edited[700] = engine.tokenize(" purple")[0]
    list(engine.generate(edited, sampling=GREEDY, max_tokens=4, ignore_eos=True))
    stats = engine.last_turn
    assert stats.cached_tokens == 700
    assert stats.prefill_tokens == len(edited) - 700
    assert stats.truncated_tokens == len(prompt) + 3 - 700
    assert "KVMEM_TRUNCATE keep=700" in trace.getvalue()
    # the blocks from the divergence on were rebuilt from the new tokens
    session = engine.session
    assert session.table.tokens[: len(edited)] == edited
    assert session.store.block_ids() == tuple(range(session.table.n_complete_blocks))

    # the same edited conversation again reuses all of it but the tail that saw the window
    list(engine.generate(edited, sampling=GREEDY, max_tokens=4, ignore_eos=True))
    turn = engine.last_turn
    assert turn.cached_tokens + turn.reprocessed_tokens == len(edited) - 1
    assert turn.cached_tokens >= len(edited) - 256
