"""Fidelity: KL and agreement against plain loops, the transcript, and the runner with fakes."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from kvmem.bench import fidelity
from kvmem.bench.conversation import Role
from kvmem.bench.engines import Method
from kvmem.bench.fidelity import TurnFidelity, kl_divergence, log_softmax, run_fidelity, summarize
from kvmem.bench.main import main
from kvmem.bench.transcript import build_transcript, history_through
from tests.fakes.bench import N_VOCAB, FakeFactory


def reference_kl(p_logits: list[float], q_logits: list[float]) -> float:
    zp = sum(math.exp(x) for x in p_logits)
    zq = sum(math.exp(x) for x in q_logits)
    return sum(
        (math.exp(a) / zp) * (math.log(math.exp(a) / zp) - math.log(math.exp(b) / zq))
        for a, b in zip(p_logits, q_logits, strict=True)
    )


def test_kl_matches_plain_python() -> None:
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((3, 7)).astype(np.float32)  # [n, n_vocab]
    test = rng.standard_normal((3, 7)).astype(np.float32)
    got = kl_divergence(ref, test)
    for i in range(3):
        assert abs(got[i] - reference_kl(ref[i].tolist(), test[i].tolist())) < 1e-9
    assert np.array_equal(kl_divergence(ref, ref), np.zeros(3))
    np.testing.assert_allclose(np.exp(log_softmax(ref)).sum(axis=-1), np.ones(3), atol=1e-12)


def test_transcript_is_deterministic_and_asks_about_earlier_turns() -> None:
    head, turns = build_transcript(seed=5, n_turns=6)
    head2, turns2 = build_transcript(seed=5, n_turns=6)
    assert head == head2 and [t.answer for t in turns] == [t.answer for t in turns2]
    for t, turn in enumerate(turns):
        assert turn.messages[-1].role is Role.USER and turn.messages[-1].content == turn.question
        assert turn.fact_turn <= max(0, t - 2)
        # the facts of the answer are in the tool results of the source turn
        source_text = "\n".join(
            m.content for m in turns[turn.fact_turn].messages if m.role is Role.TOOL
        )
        numbers = [w.strip(".;:,") for w in turn.answer.split() if any(c.isdigit() for c in w)]
        assert numbers and all(n.replace("vol-", "") in source_text for n in numbers)
    history = history_through(head, turns, 2)
    assert history[: len(head)] == head
    assert [
        m.content for m in history if m.role is Role.ASSISTANT and not m.content.startswith("<")
    ] == [turns[0].answer, turns[1].answer]


def peaked(shift: int) -> callable:
    """Logits with 4.0 on the continuation token (+shift on odd rows), 0 elsewhere."""

    def make(prompt: Sequence[int], continuation: Sequence[int]) -> np.ndarray:
        out = np.zeros((len(continuation), N_VOCAB), dtype=np.float32)  # [n_cont, n_vocab]
        for i, token in enumerate(continuation):
            out[i, (token + (shift if i % 2 else 0)) % N_VOCAB] = 4.0
        return out

    return make


def test_run_fidelity_with_fakes() -> None:
    factory = FakeFactory(
        {},
        ref_logits={Method.FULL: peaked(0), Method.RETRIEVAL: peaked(0), Method.RECENCY: peaked(1)},
    )
    steps, results = run_fidelity(
        factory,
        [Method.RETRIEVAL, Method.RECENCY],
        seed=0,
        target_tokens=7000,
        tool_size=6,
        budget=3000,
    )
    assert len(steps) >= 2
    assert [s.index for s in steps] == list(range(len(steps)))
    assert len(steps[-1].prompt) + len(steps[-1].continuation) <= 7000
    # each prompt extends the previous prompt + continuation (multi-turn reuse)
    for a, b in zip(steps, steps[1:], strict=False):
        assert b.prompt[: len(a.prompt) + len(a.continuation)] == a.prompt + a.continuation
    retrieval = [r for r in results if r.method is Method.RETRIEVAL]
    recency = [r for r in results if r.method is Method.RECENCY]
    assert all(r.mean_kl == 0.0 and r.top1_agreement == 1.0 for r in retrieval)
    p = [4.0] + [0.0] * (N_VOCAB - 1)
    q = [0.0, 4.0] + [0.0] * (N_VOCAB - 2)
    one = reference_kl(p, q)
    for r, step in zip(recency, steps, strict=True):
        n = len(step.continuation)
        n_odd = n // 2
        assert r.scored_tokens == n
        assert abs(r.mean_kl - one * n_odd / n) < 1e-9
        assert r.top1_agreement == (n - n_odd) / n
        assert abs(r.max_kl - one) < 1e-9
        assert r.coverage is None
    assert [e.method for e in factory.opened] == [Method.FULL, Method.RETRIEVAL, Method.RECENCY]
    assert all(e.closed for e in factory.opened)


def _turn(
    method: Method, turn: int, kl: list[float], agree: float, over: bool, cov: float | None
) -> TurnFidelity:
    return TurnFidelity(
        method=method,
        turn=turn,
        prompt_tokens=100 * (turn + 1),
        scored_tokens=len(kl),
        over_budget=over,
        mean_kl=float(np.mean(kl)),
        p99_kl=0.0,
        max_kl=max(kl),
        top1_agreement=agree,
        coverage=cov,
        kl=kl,
    )


def test_summarize_weights_by_token_and_splits_scopes() -> None:
    results = [
        _turn(Method.RETRIEVAL, 0, [0.0, 0.0], 1.0, False, None),
        _turn(Method.RETRIEVAL, 1, [0.3, 0.0, 0.0, 0.1], 0.75, True, 0.5),
        _turn(Method.RETRIEVAL, 2, [0.2, 0.2], 0.5, True, 0.7),
    ]
    overall, over = summarize(results)
    assert (overall.scope, over.scope) == ("all", "over_budget")
    assert overall.turns == 3 and overall.scored_tokens == 8
    assert abs(overall.mean_kl - 0.8 / 8) < 1e-12
    assert abs(overall.top1_agreement - (2 * 1.0 + 4 * 0.75 + 2 * 0.5) / 8) < 1e-12
    assert abs(overall.p99_kl - float(np.percentile([0, 0, 0.3, 0, 0, 0.1, 0.2, 0.2], 99))) < 1e-12
    assert overall.mean_coverage == pytest.approx(0.6)
    assert over.turns == 2 and over.scored_tokens == 6
    assert abs(over.mean_kl - 0.8 / 6) < 1e-12


def test_command_writes_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    factory = FakeFactory(
        {},
        ref_logits={Method.FULL: peaked(0), Method.RETRIEVAL: peaked(0), Method.RECENCY: peaked(3)},
    )
    monkeypatch.setattr(fidelity, "LlamaEngineFactory", lambda settings: factory)
    assert (
        main(["fidelity", "--target-tokens", "5000", "--tool-size", "6", "--out", str(tmp_path)])
        == 0
    )
    assert "fidelity overall" in capsys.readouterr().out
    doc = json.loads((tmp_path / "fidelity.json").read_text())
    assert doc["command"] == "fidelity"
    assert set(doc) >= {"settings", "machine", "transcript", "overall", "turns", "seconds"}
    assert [(s["method"], s["scope"]) for s in doc["overall"]] == [
        ("retrieval", "all"),
        ("retrieval", "over_budget"),
        ("recency", "all"),
        ("recency", "over_budget"),
    ]
    for s in doc["overall"]:
        if s["scored_tokens"]:
            assert s["mean_kl"] >= 0 and 0 <= s["top1_agreement"] <= 1
    turn = doc["turns"][0]
    assert set(turn) >= {
        "method",
        "turn",
        "prompt_tokens",
        "scored_tokens",
        "over_budget",
        "mean_kl",
        "p99_kl",
        "max_kl",
        "top1_agreement",
        "coverage",
        "coverage_by_layer",
        "kl",
    }
    assert main(["fidelity", "--methods", "full"]) == 2
