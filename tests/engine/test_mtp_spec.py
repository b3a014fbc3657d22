"""MTP drafts (--spec-type draft-mtp) on the tiny synthetic qwen35 with one nextn layer:
greedy output is token for token the output without drafts, under budget and over budget
(reselection, eviction, the generation ring spill, multi-turn reuse), with f16 and q8_0
draft KV; the draft context follows the target's window; a model without an MTP head is
refused before its weights load.

The random synthetic head's drafts are (nearly) never accepted; the "echo" head
(hybrid_models.write_echo_head_hybrid: a weak trunk and a head that passes the token
embedding through) agrees with the trunk often but not always, so accepted and rejected
drafts are both exercised, deterministically."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

from kvmem.config import KVMemConfig
from kvmem.engine.engine import Engine
from kvmem.engine.hybrid.hybrid_codec import RecurrentState, parse_hybrid_state
from kvmem.engine.hybrid.recurrent_state import read_recurrent
from kvmem.engine.llama import model as model_module
from kvmem.engine.transfer.state_codec import parse_state
from kvmem.engine_settings import EngineSettings
from kvmem.errors import ConfigError
from kvmem.memory.ggml_types import GgmlType
from kvmem.spec_config import SpecConfig, SpecType

from .helpers import GREEDY, TINY_OVER
from .hybrid_models import (  # noqa: F401  (fixture)
    tiny_hybrid_path,
    write_echo_head_hybrid,
    write_tiny_hybrid,
)

pytestmark = pytest.mark.slow

BT = 32
UNDER = KVMemConfig(budget=1024, gen_reserve=128, block_tokens=BT)
OVER = TINY_OVER  # a budget/2 stream: the prefill leaves blocks for reselections to restore
NO_DRAFTS = SpecConfig()
# the gate off: every step drafts, so the draft statistics below are deterministic
MTP = SpecConfig(type=SpecType.MTP, n_max=3, gate=False)
MTP_Q8 = SpecConfig(type=SpecType.MTP, n_max=3, kv_type=GgmlType.Q8_0, gate=False)


def tokens(n: int, seed: int = 0) -> list[int]:
    return [1 + (7 * i + 13 * seed) % 900 for i in range(n)]


@pytest.fixture(scope="module")
def mtp_paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("mtp")
    return {"random": write_tiny_hybrid(d, nextn_layers=1), "echo": write_echo_head_hybrid(d)}


def engine(path: Path, kvmem: KVMemConfig, spec: SpecConfig = NO_DRAFTS, trace=None) -> Engine:
    settings = EngineSettings(
        model_path=str(path),
        n_ctx=2048,
        n_batch=64,
        n_ubatch=64,
        n_threads=1,
        kvmem=kvmem,
        spec=spec,
    )
    return Engine(settings, trace_stream=trace)


def conversation(e: Engine) -> tuple[list[list[int]], list[tuple[int, int, int]]]:
    """Three turns, each reusing the history; the third diverges inside it. Returns the
    outputs and per turn (draft_n, spilled blocks, evicted blocks)."""
    base = tokens(400, seed=3)
    prompt = base[:200]
    outs, stats = [], []
    for t in range(3):
        out = list(e.generate(prompt, sampling=GREEDY, max_tokens=90))
        st = e.last_turn
        outs.append(out)
        stats.append((st.draft_n, st.spilled_blocks, st.evicted_blocks + st.stage_in_blocks))
        if t == 0:
            prompt = prompt + out + base[200:230]
        else:  # diverge inside the history: the second turn's answer is cut
            prompt = prompt[: len(prompt) - 60] + base[300:320]
    return outs, stats


@pytest.fixture(scope="module")
def plain_outputs(mtp_paths: dict[str, Path]) -> dict[tuple[str, str], tuple]:
    result = {}
    for head, window, kv in (("random", "under", UNDER), ("random", "over", OVER)):
        result[head, window] = _plain(mtp_paths[head], kv)
    result["echo", "over"] = _plain(mtp_paths["echo"], OVER)
    return result


def _plain(path: Path, kv: KVMemConfig) -> tuple[list[list[int]], RecurrentState]:
    e = engine(path, kv)
    try:
        return conversation(e)[0], read_recurrent(e.ctx)
    finally:
        e.close()


@pytest.mark.parametrize(
    ("head", "window", "spec"),
    [
        ("random", "under", MTP),
        ("random", "over", MTP),
        ("random", "over", MTP_Q8),
        ("echo", "over", MTP),
    ],
    ids=["under-f16", "over-f16", "over-q8_0", "echo-head-over-f16"],
)
def test_greedy_with_mtp_drafts_equals_no_drafts(
    mtp_paths: dict[str, Path], plain_outputs: dict, head: str, window: str, spec: SpecConfig
) -> None:
    kv = UNDER if window == "under" else OVER
    trace = io.StringIO()
    e = engine(mtp_paths[head], kv, spec, trace)
    try:
        outs, stats = conversation(e)
        assert e.mtp is not None and e.mtp.n_drafted_steps > 0
        if window == "over":
            # the draft context never holds a cell the target's window does not
            target = parse_hybrid_state(bytes(e.ctx.get_state(0)), cell_ext=True).attn
            draft = parse_state(bytes(e.mtp.ctx.get_state(0)), cell_ext=True)
            assert len(draft.positions) > 0
            assert set(draft.positions.tolist()) <= set(target.positions.tolist())
        total = e.stats
        recurrent = read_recurrent(e.ctx)
    finally:
        e.close()
    want, want_recurrent = plain_outputs[head, window]
    assert outs == want
    # the recurrent state folded in the accepted tokens only: that of decoding without
    # drafts (up to the rounding of re-decoding accepted tokens as one batch)
    assert recurrent.positions.tolist() == want_recurrent.positions.tolist()
    for got, ref in zip(
        recurrent.r + recurrent.s, want_recurrent.r + want_recurrent.s, strict=True
    ):
        np.testing.assert_allclose(got.view(np.float32), ref.view(np.float32), atol=1e-4)
    if head == "echo":  # accepted and rejected drafts, deterministically
        assert 0 < total.draft_n_accepted < total.draft_n
    assert [len(o) for o in outs] == [90, 90, 90]
    assert all(d > 0 for d, _, _ in stats)  # every turn drafted and verified
    assert total.draft_n == sum(d for d, _, _ in stats) and total.draft_n_accepted >= 0
    if window == "over":
        assert sum(s for _, s, _ in stats) > 0  # the ring spill ran during generation
        assert all(moved > 0 for _, _, moved in stats)  # the window changed every turn
        assert '"spilled_blocks"' in trace.getvalue() or "spill" in trace.getvalue()


def test_a_model_without_an_mtp_head_is_refused_before_loading(
    tiny_hybrid_path: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(*_args, **_kwargs):
        raise AssertionError("the model was loaded before the MTP head was checked")

    monkeypatch.setattr(model_module.LlamaModel, "__init__", refuse)
    settings = EngineSettings(model_path=str(tiny_hybrid_path), spec=MTP)
    with pytest.raises(ConfigError, match="draft-mtp needs a model with an MTP \\(nextn\\) head"):
        settings.validate()
    with pytest.raises(ConfigError, match="has none"):
        Engine(settings)


def test_the_draft_gate_keeps_the_greedy_output(mtp_paths: dict[str, Path], plain_outputs: dict):
    """With the gate on (the default), whichever steps it lets draft, the output over
    budget is the output of decoding without drafts, turn for turn."""
    e = engine(mtp_paths["echo"], OVER, SpecConfig(type=SpecType.MTP, n_max=3))
    try:
        outs, _ = conversation(e)
        assert outs == plain_outputs["echo", "over"][0]
        gate = e.session.spec.gate
        assert gate is not None and gate.steps > 0 and gate.cost[1] is not None
    finally:
        e.close()
