"""Drafting only while it pays: the gate in front of every speculative step.

A step with a draft costs the drafter's calls and a verification batch, and on a hybrid
model a rejected draft also costs a recurrent-state rewind and a re-decode; at zero
acceptance on the H200 that made MTP decoding 12x slower than plain decoding. The gate
keeps a moving average of the seconds per emitted token of steps with drafts and of plain
steps (both emit the same tokens: verification keeps greedy output unchanged), takes the
faster mode, and now and then takes the other one for a step so that its estimate follows
the text (acceptance changes when the model starts echoing a file): 32 steps after the
faster mode changed, then at gaps that double up to 1,024 steps.
Only which steps draft changes, never a token.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PROBE_FIRST = 32  # steps before the mode not in use is tried again
PROBE_MAX = 1024  # the longest gap between two probes
ALPHA = 0.25  # weight of the newest step in the moving averages


@dataclass(slots=True)
class DraftGate:
    probe_first: int = PROBE_FIRST
    probe_max: int = PROBE_MAX
    alpha: float = ALPHA
    # seconds per emitted token: [plain steps, steps with a draft]; None until measured
    cost: list[float | None] = field(default_factory=lambda: [None, None])
    steps: int = 0
    skipped: int = 0  # steps the gate kept plain although a draft was possible
    _gap: int = 0  # steps until the next probe is due after this one
    _next_probe: int = 0
    _best: bool | None = None

    def wants_draft(self) -> bool:
        """Whether this step drafts (call once per step)."""
        self.steps += 1
        plain, drafted = self.cost
        if drafted is None:
            return True  # drafts first: they are what was asked for
        if plain is None:
            return False
        best = drafted <= plain
        if best != self._best:  # the faster mode changed: probe soon again
            self._best, self._gap = best, self.probe_first
            self._next_probe = self.steps + self._gap
        wants = best
        if self.steps >= self._next_probe:  # one step of the other mode, then twice as long
            wants = not best
            self._gap = min(2 * self._gap, self.probe_max)
            self._next_probe = self.steps + self._gap
        if not wants:
            self.skipped += 1
        return wants

    def record(self, drafted: bool, seconds: float, emitted: int) -> None:
        """A finished step: whether it verified a draft, its time and the tokens it emitted."""
        rate = seconds / max(1, emitted)
        old = self.cost[int(drafted)]
        self.cost[int(drafted)] = rate if old is None else old + self.alpha * (rate - old)
