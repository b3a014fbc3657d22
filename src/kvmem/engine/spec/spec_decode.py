"""Speculative decoding inside a KVMem session's generate loop.

Each step starts from the token just sampled (not yet decoded). The drafter proposes up
to `--spec-draft-n-max` tokens (prompt lookup: memory.ngram_draft over the session's whole
token history, host-store blocks included, since the history is the block table's tokens);
the window makes room for the token first, exactly as plain decoding would (the ring
spill frees this generation's oldest block when the reserve is full), and the draft is cut
to the reserve's free cells (the reserve counts the draft rows), so every token sees the
window it would see without drafts and greedy output is unchanged; the batch
is verified in one decode (engine.speculative.verify_draft: the rejected cells are removed
before anything is recorded, and on a hybrid memory the recurrent state folds in only the
accepted tokens); then only the accepted tokens enter the block table, so a rejected draft
cell is never harvested. A draft is cut so that it never runs past max_tokens or the
context. Returned: the emitted tokens (the accepted drafts, already in the cache, then the
next token, sampled but not decoded).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import numpy as np

from kvmem.memory.ngram_draft import NgramDraftParams, draft_ngram
from kvmem.spec_config import SpecConfig, SpecType

from ..llama.host_staging import StagingBuffer
from ..llama.llama_lib import pinned_staging
from ..llama.sampler import Sampler
from ..trace import TurnStats
from .decode_target import DecodeTarget
from .draft_gate import DraftGate
from .speculative import verify_draft

logger = logging.getLogger(__name__)

SNAPSHOT_BYTES = 1 << 30  # a recurrent snapshot larger than this goes to owned memory

Drafter = Callable[[np.ndarray, int], list[int]]  # (history incl. the last token, n) -> draft


class NgramDrafter:
    """Prompt lookup over the session's history (llama.cpp `ngram-simple`)."""

    def __init__(self, n_max: int) -> None:
        self.params = NgramDraftParams(n_draft=n_max)

    def __call__(self, history: np.ndarray, n: int) -> list[int]:
        return draft_ngram(history, self.params)[:n]


class SpecDecoder:
    def __init__(self, config: SpecConfig, drafter: Drafter | None = None) -> None:
        self.config = config
        if drafter is None:
            if config.type is not SpecType.NGRAM:
                raise ValueError(f"no built-in drafter for {config.type.value}")
            drafter = NgramDrafter(config.n_max)
        self.drafter = drafter
        # drafts only while they are faster than plain steps (None: every step drafts)
        self.gate = DraftGate() if config.gate else None
        # where a hybrid's recurrent snapshots go (page-locked; memory only on first use,
        # so nothing on a plain model; None on a CPU build: owned memory per snapshot)
        self._staging: StagingBuffer | None = pinned_staging(SNAPSHOT_BYTES)

    def step(
        self,
        target: DecodeTarget,
        sampler: Sampler,
        token: int,
        stats: TurnStats,
        gen_start: int,
        left: int,
        logits_out: list[np.ndarray] | None,
        is_eog: Callable[[int], bool],
    ) -> list[int]:
        """One verification step from `token`; `left`: tokens the turn may still emit
        (-1: no limit). Returns the emitted tokens (see the module doc)."""
        pos = target.n_tokens
        n = self.config.n_max
        if left >= 0:
            n = min(n, left - 1)  # the accepted drafts and the bonus token fit max_tokens
        n = max(0, min(n, target.n_ctx - pos - 2, target.ctx.n_batch - 1))
        # room for the token as plain decoding makes it (the same spill at the same
        # token), then drafts only in the reserve's free cells: every token sees the
        # window it would see without drafts
        room = target.draft_room(stats, gen_start)
        if room is not None:
            n = max(0, min(n, room))
        draft: Sequence[int] = []
        t0 = time.perf_counter()
        if n > 0 and (self.gate is None or self.gate.wants_draft()):
            history = np.append(target.history(), token)  # [n_tokens + 1]
            draft = self.drafter(history, n)[:n]
        target.note_decode()
        result = verify_draft(
            target.ctx,
            sampler,
            pos,
            token,
            draft,
            is_eog,
            rows_out=logits_out,
            staging=self._staging,
        )
        target.accept([token, *draft[: result.n_accepted]], stats)
        if n > 0 and self.gate is not None:
            self.gate.record(bool(draft), time.perf_counter() - t0, len(result.tokens))
        stats.draft_n += result.n_drafted
        stats.draft_n_accepted += result.n_accepted
        return result.tokens

    def close(self) -> None:
        if self._staging is not None:
            self._staging.close()
            self._staging = None


def spec_decoder(config: SpecConfig, mtp: Drafter | None = None) -> SpecDecoder | None:
    """The session's decoder: prompt lookup, or MTP drafts from `mtp` (mtp_draft.py)."""
    if config.type is SpecType.NGRAM:
        return SpecDecoder(config)
    if config.type is SpecType.MTP:
        if mtp is None:
            raise ValueError("draft-mtp needs the engine's MTP drafter")
        return SpecDecoder(config, mtp)
    return None
