"""--kvmem-conversations: two alternating conversations stay warm and isolated (SmolLM2)."""

from __future__ import annotations

import io

import pytest

from kvmem.config import KVMemConfig
from kvmem.engine.engine import Engine

from .helpers import GREEDY, filler_tokens, make_engine

pytestmark = pytest.mark.slow

BT = 128


def turn_tokens(engine: Engine, conv: str, turn: int) -> list[int]:
    return (
        engine.tokenize(f"\nUser ({conv}, turn {turn}): ")
        + filler_tokens(engine, 80, seed=10 * ord(conv) + turn)[1:]
    )


def run(engine: Engine, prompt: list[int]) -> list[int]:
    return list(engine.generate(prompt, sampling=GREEDY, max_tokens=8))


def test_two_conversations_alternate_warm_isolated_and_evict_lru(smollm2_path: str) -> None:
    kv = KVMemConfig(budget=1024, gen_reserve=256, trace=True)
    single = make_engine(smollm2_path, kvmem=kv)
    system = filler_tokens(single, 40, seed=99)  # shared by every conversation
    expected: dict[str, list[list[int]]] = {}
    prompts: dict[str, list[list[int]]] = {}
    for conv in ("A", "B"):
        single.reset()
        history = list(system)
        expected[conv], prompts[conv] = [], []
        for turn in range(3):
            history += turn_tokens(single, conv, turn)
            prompts[conv].append(list(history))
            out = run(single, history)
            expected[conv].append(out)
            history += out
    single.close()

    trace = io.StringIO()
    pool_engine = make_engine(
        smollm2_path,
        kvmem=KVMemConfig(budget=1024, gen_reserve=256, conversations=2, trace=True),
        trace=trace,
    )
    for turn in range(3):
        for conv in ("A", "B"):
            prompt = prompts[conv][turn]
            assert run(pool_engine, prompt) == expected[conv][turn], (conv, turn)
            cached = pool_engine.last_turn.cached_tokens
            if turn == 0:
                assert cached == 0, (conv, cached)  # B shares only the system prompt with A
            else:
                previous = len(prompts[conv][turn - 1]) + len(expected[conv][turn - 1])
                assert cached >= (previous // BT) * BT, (conv, turn, cached)
    pool = pool_engine.pool
    assert pool is not None and len(pool.conversations) == 2
    for conv, name in zip(pool.conversations, ("A", "B"), strict=True):
        tokens = conv.session.tokens if conv is pool.active else conv.history.tolist()
        full = prompts[name][2] + expected[name][2]
        assert full[: len(tokens)] == tokens  # only its own tokens
    assert (
        pool.cost.switches == 5 and pool_engine.stats.conversation_switches == 5
    )  # B1 A2 B2 A3 B3
    assert "KVMEM_SWITCH from_conv=0 to_conv=1" in trace.getvalue()

    # a third conversation evicts the least recently used one (A)
    run(pool_engine, system + turn_tokens(pool_engine, "C", 0))
    assert pool.evicted == 1 and pool_engine.stats.conversations_evicted == 1
    run(pool_engine, prompts["B"][2] + expected["B"][2] + turn_tokens(pool_engine, "B", 3))
    assert pool_engine.last_turn.cached_tokens >= (len(prompts["B"][2]) // BT) * BT
    run(pool_engine, prompts["A"][2])  # A is gone: evicts C, starts over
    assert pool_engine.last_turn.cached_tokens == 0 and pool.evicted == 2
    pool_engine.close()
