"""`--kv-unified`: the ledger that keeps the lanes' running requests within one `-c`
(kvmem.server.context_pool), and the flag's parsing (the live server test is
tests/server/test_live_kv_unified.py)."""

from __future__ import annotations

import pytest

from kvmem.cli.server_config import load_server_settings
from kvmem.errors import ContextPoolExhaustedError
from kvmem.server.context_pool import SharedContextPool
from kvmem.server.error_map import classify


class CountingEngine:
    """An engine whose `generate` yields `n` token ids (the ledger only counts them)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.closed = False

    def generate(self, prompt, **_):
        try:
            yield from range(1, self.n + 1)
        finally:
            self.closed = True


def test_holds_grow_and_release_per_lane() -> None:
    pool = SharedContextPool(256)
    pool.hold(0, 100)
    pool.hold(1, 156)
    assert pool.used == 256
    pool.hold(0, 90)  # a lane's hold is replaced, not added
    assert pool.used == 246
    with pytest.raises(ContextPoolExhaustedError) as info:
        pool.hold(0, 101)
    assert (info.value.needed, info.value.free, info.value.n_ctx) == (11, 10, 256)
    assert str(info.value).startswith("Context size has been exceeded.")
    assert pool.used == 246  # a refused hold changes nothing
    pool.release(1)
    pool.hold(0, 256)
    assert pool.used == 256


def test_a_generation_stops_alone_when_the_pool_is_full() -> None:
    pool = SharedContextPool(64)
    pool.hold(1, 40)  # the other lane's running request
    engine = CountingEngine(50)
    tokens = pool.wrap(engine, 0).generate([7] * 10)
    got = []
    with pytest.raises(ContextPoolExhaustedError):
        for token in tokens:
            got.append(token)
    assert got == list(range(1, 15))  # 10 + 14 = 24 = 64 - 40
    assert engine.closed and pool.used == 64
    pool.release(0)
    with pytest.raises(ContextPoolExhaustedError):  # the prompt alone does not fit
        pool.wrap(CountingEngine(1), 0).generate([7] * 25)
    assert pool.used == 40


def test_the_error_is_llama_servers_500() -> None:
    error = classify(ContextPoolExhaustedError(5, 0, 256))
    assert (error.status, error.type, error.code) == (500, "server_error", "context_pool_exhausted")


@pytest.mark.parametrize(
    ("argv", "env", "unified"),
    [
        ([], {}, False),
        (["--kv-unified"], {}, True),
        (["-kvu", "-no-kvu"], {}, False),
        ([], {"LLAMA_ARG_KV_UNIFIED": "1"}, True),
    ],
)
def test_the_flag(argv: list[str], env: dict[str, str], unified: bool) -> None:
    settings, _ = load_server_settings(["-np", "2", *argv], env)
    assert settings.kv_unified is unified
