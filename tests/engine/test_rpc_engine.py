"""KVMem over llama.cpp's RPC backend: SmolLM2's layers split across two kvmem-rpc-worker
processes on loopback, against the same engine run locally."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pytest

from kvmem.config import KVMemConfig, QuerySource
from kvmem.engine.engine import Engine
from kvmem.engine.trace import TurnStats
from kvmem.engine_settings import EngineSettings, GpuPlacement
from kvmem.errors import RpcUnavailableError
from kvmem.settings.rpc_endpoints import RpcEndpoint
from tests.rpc_workers import Worker, endpoints, require_rpc, start_workers, stop_workers

from .helpers import GREEDY, filler_tokens

FITS = KVMemConfig(budget=4096, gen_reserve=512)
OVER = KVMemConfig(budget=512, gen_reserve=256)  # 2K-token conversations exceed it


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Worker]]:
    require_rpc()
    # -t as the local engine's: ggml's CPU kernels split some reductions by thread count
    started = start_workers(2, tmp_path_factory.mktemp("rpc-workers"), threads=2)
    yield started
    stop_workers(started)


def _engine(path: str, kvmem: KVMemConfig, workers: list[Worker] | None = None) -> Engine:
    placement = (
        GpuPlacement(tensor_split=(1.0, 1.0), rpc=endpoints(workers)) if workers else GpuPlacement()
    )
    settings = EngineSettings(
        model_path=path,
        n_ctx=2048,
        n_batch=512,
        n_ubatch=128,
        n_threads=2,
        kvmem=kvmem,
        placement=placement,
    )
    return Engine(settings)


def _greedy(engine: Engine, prompt: list[int], n: int = 12) -> list[int]:
    return list(engine.generate(prompt, sampling=GREEDY, max_tokens=n))


@pytest.mark.parametrize("kvmem", [FITS, KVMemConfig(enabled=False)], ids=["kvmem", "no-kvmem"])
def test_everything_fits_greedy_equals_local(smollm2_path: str, workers, kvmem) -> None:
    local, remote = _engine(smollm2_path, kvmem), _engine(smollm2_path, kvmem, workers)
    try:
        layers = remote.info.layers
        assert layers is not None
        at = dict(layers.endpoints)  # device name -> worker
        # -ts 1,1 over 30 layers + output (llama.cpp's split points): 16 | 14 + output
        first, second = str(workers[0].endpoint), str(workers[1].endpoint)
        assert [at[d] for d in layers.devices] == [first] * 16 + [second] * 14
        assert at[layers.output] == second
        assert local.info.layers is not None and set(local.info.layers.devices) == {"CPU"}
        prompt = filler_tokens(local, 200, seed=11)
        assert _greedy(remote, prompt) == _greedy(local, prompt)
    finally:
        local.close()
        remote.close()


@pytest.fixture(scope="module")
def over_budget(smollm2_path: str, workers) -> Iterator[tuple[Engine, Engine]]:
    local, remote = _engine(smollm2_path, OVER), _engine(smollm2_path, OVER, workers)
    yield local, remote
    local.close()
    remote.close()


def _next_logits(engine: Engine, prompt: list[int], token: int, evict_restore: bool) -> np.ndarray:
    engine.reset()
    engine.teacher_force(prompt, [token])
    if evict_restore:
        engine.session.window.evict([1])
        assert not engine.session.table.is_on_gpu(1)
        stats = TurnStats()
        stats.add(engine.session.window.restore({1: 128}))
        assert stats.stage_in_blocks == 1
    engine.session.ctx.decode([token], len(prompt), [True])
    return engine.session.ctx.logits(-1)


def test_evict_restore_round_trip_is_bit_exact_across_workers(over_budget) -> None:
    local, remote = over_budget
    tokens = filler_tokens(local, 3 * 128 + 40, seed=7)
    prompt, token = tokens[:-1], tokens[-1]
    reference = _next_logits(remote, prompt, token, evict_restore=False)
    restored = _next_logits(remote, prompt, token, evict_restore=True)
    assert np.array_equal(restored, reference)
    assert np.array_equal(restored, _next_logits(local, prompt, token, evict_restore=False))
    # the harvested block's bytes are the local engine's, byte for byte
    _next_logits(local, prompt, token, evict_restore=True)
    ours, theirs = remote.session.store.get(1), local.session.store.get(1)
    assert np.array_equal(ours.positions, theirs.positions)
    for a, b in zip(ours.k + ours.v, theirs.k + theirs.v, strict=True):
        assert np.array_equal(a, b)
    profile = remote.transfer_profile()  # the state paths crossed the network, and said so
    assert profile["state_get"]["net_bytes"] > profile["state_get"]["bytes"] // 2 > 0
    assert profile["state_set"]["net_bytes"] > 0


@pytest.mark.parametrize("source", [QuerySource.MAIN, QuerySource.SCORING], ids=lambda q: q.value)
def test_multi_turn_over_budget_matches_local(smollm2_path: str, workers, source) -> None:
    kvmem = replace(OVER, query_source=source)  # query capture on the main or the scoring context
    local, remote = _engine(smollm2_path, kvmem), _engine(smollm2_path, kvmem, workers)
    try:
        base = filler_tokens(local, 1200, seed=5)
        outputs: dict[str, list[list[int]]] = {"local": [], "remote": []}
        stats: dict[str, list[tuple[int, ...]]] = {"local": [], "remote": []}
        for name, engine in (("local", local), ("remote", remote)):
            prompt = list(base[:600])
            for turn in range(3):
                out = _greedy(engine, prompt, 8)
                outputs[name].append(out)
                st = engine.last_turn
                stats[name].append(
                    (
                        st.cached_tokens,
                        st.reprocessed_tokens,
                        st.stage_in_blocks,
                        st.harvested_blocks,
                    )
                )
                prompt = prompt + out + list(base[600 + 200 * turn : 800 + 200 * turn])
            # it really went over the budget: blocks were harvested and brought back
            assert engine.session.table.n_complete_blocks * 128 > OVER.budget
        assert outputs["remote"] == outputs["local"]
        assert stats["remote"] == stats["local"]  # the same memory decisions, turn by turn
        assert sum(s[2] for s in stats["remote"]) > 0
        paths = remote.transfer_profile()
        assert paths["prefill_decode"]["net_bytes"] > 0
        assert paths["state_get"]["net_bytes"] > 0
    finally:
        local.close()
        remote.close()


def test_unreachable_worker_is_an_error_not_an_abort(smollm2_path: str) -> None:
    require_rpc()
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(RpcUnavailableError) as err:
        _engine_at(smollm2_path, RpcEndpoint("127.0.0.1", port))
    assert str(err.value).startswith(f"cannot reach the RPC worker 127.0.0.1:{port}: ")


def _engine_at(path: str, endpoint: RpcEndpoint) -> Engine:
    settings = EngineSettings(model_path=path, n_ctx=512, placement=GpuPlacement(rpc=(endpoint,)))
    return Engine(settings)
