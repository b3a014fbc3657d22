"""DraftGate: drafts only while steps with drafts cost less per emitted token than plain
steps, re-probing the other mode at doubling gaps."""

from __future__ import annotations

from kvmem.engine.spec.draft_gate import DraftGate


def _run(gate: DraftGate, steps: int, cost_draft: float, cost_plain: float) -> list[int]:
    """The steps (1-based) that drafted, each step emitting one token at the given cost."""
    drafted = []
    for i in range(1, steps + 1):
        wants = gate.wants_draft()
        if wants:
            drafted.append(i)
        gate.record(wants, cost_draft if wants else cost_plain, 1)
    return drafted


def test_drafts_that_cost_more_are_probed_at_doubling_gaps():
    gate = DraftGate(probe_first=32, probe_max=1024)
    # the first step drafts, the second measures plain; then a probe 32, 64, 128 steps on
    assert _run(gate, 300, cost_draft=12.0, cost_plain=1.0) == [1, 35, 99, 227]
    assert gate.skipped == 295  # every plain step but the one that measured plain first


def test_drafts_that_pay_stay_on_with_plain_probes():
    gate = DraftGate(probe_first=8, probe_max=16)
    drafted = _run(gate, 60, cost_draft=0.5, cost_plain=1.0)
    plain = sorted(set(range(1, 61)) - set(drafted))
    assert plain == [2, 11, 27, 43, 59]  # the first plain sample, then gaps of 8, 16, 16, 16


def test_a_change_in_acceptance_switches_the_mode():
    gate = DraftGate(probe_first=4, probe_max=8, alpha=1.0)
    assert _run(gate, 20, cost_draft=3.0, cost_plain=1.0) == [1, 7, 15]
    # drafts become cheap (the model started echoing): the next probe (step 23) switches to
    # drafts, and plain is probed from then on instead
    later = _run(gate, 20, cost_draft=0.25, cost_plain=1.0)
    assert later == [3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 14, 15, 17, 18, 19, 20]


def test_rates_are_per_emitted_token():
    gate = DraftGate(alpha=1.0)
    gate.record(True, 0.4, 4)  # 4 tokens in 0.4 s
    gate.record(False, 0.2, 1)
    assert gate.cost == [0.2, 0.1]
    assert gate.wants_draft() is True
