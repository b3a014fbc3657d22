"""What the KV memory did during one chat turn (the `kvmem` object of a chat response).

A turn can run several engine segments (a thinking budget that runs out, a grammar that
waits for the end of thinking); the counters add up over them, except the cached prefix,
which is the first segment's (later segments reuse the whole history by construction).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvmem.chat.protocol import TurnStatsLike


@dataclass(slots=True)
class TurnMemory:
    cached_tokens: int = 0  # prompt prefix reused from the KV cache
    prefill_tokens: int = 0  # prompt tokens run through the model this turn
    replayed_tokens: int = 0  # query tokens run again after the window was reselected
    retrieved_blocks: int = 0  # blocks staged in from the host store
    stored_blocks: int = 0  # blocks harvested/staged out to the host store
    truncated_tokens: int = 0  # history dropped because the prompt diverged from it
    reselect_ms: float = 0.0
    segments: int = 0
    draft_n: int = 0  # speculative draft tokens verified
    draft_n_accepted: int = 0

    def add(self, stats: TurnStatsLike) -> None:
        if self.segments == 0:
            self.cached_tokens = stats.cached_tokens
        self.segments += 1
        self.prefill_tokens += stats.prefill_tokens
        self.replayed_tokens += stats.replayed_tokens
        self.retrieved_blocks += stats.stage_in_blocks
        self.stored_blocks += stats.harvested_blocks
        self.truncated_tokens += stats.truncated_tokens
        self.reselect_ms += stats.reselect_ms
        self.draft_n += getattr(stats, "draft_n", 0)
        self.draft_n_accepted += getattr(stats, "draft_n_accepted", 0)

    @property
    def reprocessed_tokens(self) -> int:
        """Everything the model computed for this turn's input: new and replayed tokens."""
        return self.prefill_tokens + self.replayed_tokens

    def body(self, block_tokens: int) -> dict[str, Any]:
        """The `kvmem` response object; `block_tokens` converts retrieved blocks to tokens."""
        return {
            "cached_tokens": self.cached_tokens,
            "reprocessed_tokens": self.reprocessed_tokens,
            "retrieved_tokens": self.retrieved_blocks * block_tokens,
            "prefill_tokens": self.prefill_tokens,
            "replayed_tokens": self.replayed_tokens,
            "retrieved_blocks": self.retrieved_blocks,
            "stored_blocks": self.stored_blocks,
            "truncated_tokens": self.truncated_tokens,
            "reselect_ms": round(self.reselect_ms, 3),
        }
