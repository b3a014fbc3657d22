"""Stop strings over streamed text.

Text that might be the beginning of a stop string is held back until it is known either
to complete a stop string (generation ends, the stop string is not returned) or not
(the held text is released).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class StopResult:
    """What one `push` releases."""

    text: str  # safe to emit
    stopped: bool  # a stop string completed; nothing after it is emitted


def held_prefix_length(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of one of `markers`."""
    best = 0
    for marker in markers:
        for n in range(min(len(marker) - 1, len(text)), best, -1):
            if text.endswith(marker[:n]):
                best = n
                break
    return best


class StopMatcher:
    """Finds the first stop string in a stream of text deltas."""

    __slots__ = ("_stops", "_held", "_stopped", "_matched")

    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._held = ""
        self._stopped = False
        self._matched = ""

    @property
    def stopped(self) -> bool:
        return self._stopped

    @property
    def matched(self) -> str:
        """The stop string that ended the text ("" until one does)."""
        return self._matched

    def push(self, text: str) -> StopResult:
        if self._stopped:
            return StopResult("", True)
        if not self._stops:
            return StopResult(text, False)
        buffer = self._held + text
        first = -1
        for stop in self._stops:
            at = buffer.find(stop)
            if at != -1 and (first == -1 or at < first):
                first, self._matched = at, stop
        if first != -1:
            self._held = ""
            self._stopped = True
            return StopResult(buffer[:first], True)
        keep = held_prefix_length(buffer, self._stops)
        self._held = buffer[len(buffer) - keep :] if keep else ""
        return StopResult(buffer[: len(buffer) - keep], False)

    def flush(self) -> str:
        """Release held text at the end of generation."""
        held, self._held = self._held, ""
        return "" if self._stopped else held
