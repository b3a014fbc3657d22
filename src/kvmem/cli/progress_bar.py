"""Progress bars on stderr (tqdm): a long prompt's processing in kvmem-cli, the cases of a
long kvmem-bench command.

A bar shows when stderr is a terminal; `--progress-bar` forces it on (a captured or piped
stderr gets tqdm's carriage-return lines), `--no-progress-bar` off. kvmem-cli's bar counts
the prompt's new tokens (the reused prefix is not processed again) with their rate, from
the engine's progress callback (`kvmem.engine.trace.PrefillProgress`), and is shown for a
prompt of LONG_PROMPT_TOKENS new tokens or more (any prompt when forced); it is cleared
when the prompt is done, before the reply is written.
"""

from __future__ import annotations

import sys
from typing import Any

from tqdm import tqdm

LONG_PROMPT_TOKENS = 256  # new prompt tokens from which kvmem-cli shows its bar


def wants_bar(forced: bool | None) -> bool:
    """--progress-bar (True), --no-progress-bar (False), or None: when stderr is a terminal."""
    return sys.stderr.isatty() if forced is None else forced


def stderr_bar(forced: bool | None, **kwargs: Any) -> tqdm:
    """A tqdm bar on stderr, disabled (drawing nothing) when no bar is wanted."""
    kwargs.setdefault("mininterval", 0)  # updates are coarse (a chunk, a case): draw each
    kwargs.setdefault("miniters", 1)
    return tqdm(file=sys.stderr, disable=not wants_bar(forced), dynamic_ncols=True, **kwargs)


class PromptBar:
    """kvmem-cli's progress callback for one prompt; `close` ends the bar in any case."""

    __slots__ = ("_forced", "_bar", "_cache", "_over")

    def __init__(self, forced: bool | None) -> None:
        self._forced = forced
        self._bar: tqdm | None = None
        self._cache = 0
        self._over = False  # no bar for this prompt, or its bar is closed

    def __call__(self, progress: Any) -> None:
        """`progress` is a kvmem.engine.trace.PrefillProgress."""
        if self._over:
            return
        if self._bar is None:
            new = progress.total - progress.cache
            if not wants_bar(self._forced) or (new < LONG_PROMPT_TOKENS and not self._forced):
                self._over = True
                return
            self._cache = progress.cache
            self._bar = stderr_bar(self._forced, total=new, desc="prompt", unit="tok", leave=False)
        done = progress.processed - self._cache
        if done > self._bar.n:
            self._bar.update(done - self._bar.n)
        if progress.processed >= progress.total:
            self.close()

    def close(self) -> None:
        self._over = True
        if self._bar is not None:
            self._bar.close()
            self._bar = None
