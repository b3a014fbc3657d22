"""Verifying a draft in one batch (speculative decoding), llama.cpp-style.

A step starts from `last_token`, sampled but not yet decoded, at position `pos`. The batch
`[last_token, d_0 .. d_{n-1}]` is decoded at `pos ..` with logits for every row; then,
row by row, a token is sampled with the generation's own sampler chain (greedy or not)
and the draft token is accepted while it equals the sample (llama.cpp's
common_sampler_sample_and_accept_n): every emitted token is a true sample of the target
model given the tokens before it, so the output is the one of decoding without drafts.
The emitted tokens are the accepted drafts plus one sampled token (the correction, or a
bonus after a fully accepted draft), which becomes the next step's `last_token`. An
end-of-generation token ends the step. The cells of rejected drafts are removed, so the
cache holds `last_token` and the accepted drafts (positions pos .. pos + n_accepted).

On a hybrid memory the recurrent state cannot drop tokens by itself: with rollback planes
(ContextSettings.n_rs_seq >= the draft length) `seq_rm` rolls it back; otherwise the
recurrent state is snapshotted before the batch and, after a rejection, restored and the
accepted tokens decoded again, so it only ever folds in accepted tokens.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from kvmem.errors import DecodeError

from ..hybrid.recurrent_state import RecurrentSnapshot, rewind, snapshot_recurrent
from ..llama.batch_rows import MAIN_SEQ
from ..llama.context import LlamaContext
from ..llama.host_staging import StagingBuffer
from ..llama.sampler import Sampler

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class VerifyResult:
    """One verification step."""

    tokens: list[int]  # emitted: the accepted drafts, then one sampled token
    n_drafted: int
    n_accepted: int  # draft tokens kept (their cells stay in the cache)

    @property
    def next_pos(self) -> int:
        """Offset from the step's `pos` of the next `last_token` (= tokens[-1])."""
        return 1 + self.n_accepted


def accept_draft(
    ctx: LlamaContext,
    sampler: Sampler,
    draft: Sequence[int],
    rows: Sequence[int],
    is_eog: Callable[[int], bool],
) -> VerifyResult:
    """Sample output row rows[i] (the logits after draft[:i]) for i = 0 ..; accept draft[i]
    while it equals the sample. The sampler accepts every emitted token, in order."""
    if len(rows) != len(draft) + 1:
        raise ValueError(f"{len(draft)} draft tokens need {len(draft) + 1} logit rows")
    tokens: list[int] = []
    for i, row in enumerate(rows):
        token = sampler.sample(ctx.ptr, row)
        tokens.append(token)
        if i == len(draft) or token != draft[i] or is_eog(token):
            return VerifyResult(tokens, len(draft), len(tokens) - 1)
    raise AssertionError("unreachable")


def verify_draft(
    ctx: LlamaContext,
    sampler: Sampler,
    pos: int,
    last_token: int,
    draft: Sequence[int],
    is_eog: Callable[[int], bool] | None = None,
    rows_out: list[np.ndarray] | None = None,
    staging: StagingBuffer | None = None,
) -> VerifyResult:
    """Decode `[last_token, *draft]` at `pos ..` in one batch, accept the longest agreeing
    prefix of the draft, and remove the cells of the rejected rest (see the module doc).
    `rows_out` receives the logits row of every emitted token. `staging`: where a hybrid's
    recurrent snapshot goes (page-locked on a GPU: on the H200 a 27b-shape snapshot read and
    written back through pageable memory cost ~0.15 s a rejected step)."""
    n = len(draft)
    if 1 + n > ctx.n_batch:
        raise DecodeError(f"a draft of {n} tokens does not fit the batch of {ctx.n_batch}")
    eog = is_eog or ctx.model.is_eog
    hybrid = ctx.model.is_hybrid
    snapshot: RecurrentSnapshot | None = None
    if hybrid and n and ctx.n_rs_seq < n:
        snapshot = snapshot_recurrent(ctx, staging=staging)
    ctx.decode([last_token, *draft], pos, [True] * (1 + n))
    result = accept_draft(ctx, sampler, draft, range(1 + n), eog)
    if rows_out is not None:
        rows_out.extend(ctx.logits(i) for i in range(len(result.tokens)))
    keep_end = pos + result.next_pos  # cells [pos, keep_end) stay
    if result.n_accepted < n:
        if snapshot is not None:
            rewind(ctx, snapshot)  # back to pos - 1, then fold in the accepted tokens again
            accepted = [last_token, *draft[: result.n_accepted]]
            ctx.decode(accepted, pos, [False] * (len(accepted) - 1) + [True])
        else:
            ctx.seq_rm(MAIN_SEQ, keep_end, -1)
    logger.debug("draft %d, accepted %d at pos %d", n, result.n_accepted, pos)
    return result
