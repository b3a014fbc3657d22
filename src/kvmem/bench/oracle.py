"""The oracle: telling a KVMem session to keep given token spans in its window.

`KVMemSession.force_spans` (a tuple of `TokenSpan`s, token positions in the prompt) makes
every following reselection keep the blocks that hold those tokens. The benchmarks set it
for one case and reset it to () afterwards, so one case's oracle never leaks into the next.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from kvmem.errors import ConfigError
from kvmem.memory.spans import TokenSpan

HOOK = "force_spans"


def check_oracle_hook(engine: Any) -> None:
    """Refuse `--oracle` on a session that cannot force spans (rather than ignore it)."""
    if not hasattr(engine.session, HOOK):
        raise ConfigError(
            "--oracle",
            "this engine's KVMem session has no force_spans hook, so the needle's blocks "
            "cannot be forced into the window",
        )


@contextmanager
def forced_spans(engine: Any, spans: Sequence[TokenSpan]) -> Iterator[None]:
    """Keep `spans` in the window for the turns inside the block (nothing when empty)."""
    if not spans:
        yield
        return
    session = engine.session
    setattr(session, HOOK, tuple(spans))
    try:
        yield
    finally:
        setattr(session, HOOK, ())
