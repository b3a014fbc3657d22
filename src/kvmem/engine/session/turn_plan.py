"""TurnPlan: what one turn will do, decided once from the request and the history.

Pure: a function of the prompt's length and spans, the history's common prefix and
frontier, the settings and two answers about the window (`ranks`: whether a plan made
with the history at a position ranks any block by score; `lacking`: where the main
context's kept query rows of a span stop). No llama_cpp, no state is changed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from kvmem.config import CellOrder, KVMemConfig, QueryPolicy, QueryReplay
from kvmem.memory.spans import PromptSpans, TokenSpan

from ..query.source_kind import SourceKind


@dataclass(frozen=True, slots=True)
class ChunkGrid:
    """The prefill's chunking: chunk size, and the grid whose starts fix a chunk's stream
    window (the chunk size, or the block size for chunks smaller than a block)."""

    chunk_tokens: int
    stream_grid: int
    ubatch: int = 0  # llama.cpp's ubatch: a chunk's decode runs in ubatches from its start

    def chunk_start(self, position: int) -> int:
        """The start of the chunk holding `position`: a prefill resumed there decodes the
        chunks and ubatches a fresh one decoded (`--kvmem-cell-order canonical`)."""
        return position - position % self.chunk_tokens

    @classmethod
    def of(
        cls,
        config: KVMemConfig,
        n_batch: int,
        capacity: int,
        n_ctx: int | None = None,
        n_ubatch: int = 0,
    ) -> ChunkGrid:
        """A multiple (or, for a small batch, a divisor) of the block size that leaves room
        for the window and fits the batch and `--kvmem-chunk-tokens`. `n_ctx`: the logical
        context; one no larger than the budget never goes over it, so it never streams (the
        chunk cap, which leaves the stream its room, does not apply) and a capacity smaller
        than the protected tiers (`-c 256`) still prefills in whole chunks instead of one
        token at a time."""
        bt = config.block_tokens
        if not config.enabled:
            chunk = max(1, min(n_batch, capacity))
            return cls(chunk, max(chunk, bt), n_ubatch)
        within = n_ctx is not None and n_ctx <= config.budget
        batch = n_batch if within else min(n_batch, config.chunk_tokens)
        protected = (config.sink_blocks + config.recent_blocks + 1) * bt
        chunk = _aligned(max(1, min(batch, capacity - protected)), bt)
        if chunk < bt and within:
            chunk = _largest_whole_context_chunk(batch, capacity, n_ctx, bt, chunk)
        return cls(chunk, max(chunk, bt), n_ubatch)


def _aligned(limit: int, bt: int) -> int:
    """The largest multiple of the block size up to `limit`; for a limit smaller than a
    block, its largest divisor that fits, so every block boundary is a chunk boundary."""
    if limit >= bt:
        return limit - limit % bt
    return max(d for d in range(1, limit + 1) if bt % d == 0)


def _largest_whole_context_chunk(
    n_batch: int, capacity: int, n_ctx: int, bt: int, floor: int
) -> int:
    """The largest aligned chunk whose every stream window still holds the whole history:
    the last chunk start on its grid plus the chunk fits the capacity (then no block of a
    context that never exceeds the budget is evicted); `floor` when none is larger."""
    limit = min(n_batch, capacity)
    while limit > floor:
        chunk = _aligned(limit, bt)
        grid = max(chunk, bt)
        if (n_ctx - 1) // grid * grid + chunk <= capacity:
            return chunk
        limit = chunk - 1
    return floor


@dataclass(frozen=True, slots=True)
class TurnInputs:
    n: int  # prompt tokens
    given: PromptSpans  # the spans the chat layer located
    common: int  # the prompt's common prefix with the history
    frontier: int | None  # first position whose KV saw a chosen window
    config: KVMemConfig
    source: SourceKind
    hybrid: bool  # recurrent state: its prefill has checkpoints of its own
    grid: ChunkGrid | None = None  # the prefill's chunks (None: a resume starts anywhere)


@dataclass(frozen=True, slots=True)
class TurnPlan:
    n: int
    spans: PromptSpans  # resolved by --kvmem-query-policy
    common: int  # the common prefix, below the prompt's last token
    reused: int  # tokens of the history kept (the cut); a hybrid may go back further
    tail: int | None  # where the deferred tail starts (decoded after the plan), or None
    wanted: tuple[TokenSpan, ...]  # the spans whose query vectors score the plan
    lexical: tuple[TokenSpan, ...] = ()  # the spans whose tokens are the BM25 query

    @property
    def end(self) -> int:
        """Where the window's plan is made: the prompt's end, or the deferred tail."""
        return self.n if self.tail is None else self.tail


Ranks = Callable[[PromptSpans, int], bool]  # (spans, history end) -> ranks any block
Lacking = Callable[[TokenSpan, int], int | None]  # (span, reused) -> first missing row


def plan_turn(inputs: TurnInputs, ranks: Ranks, lacking: Lacking) -> TurnPlan:
    n, c = inputs.n, inputs.config
    spans = resolve_spans(inputs.given, n, c)
    tail = deferred_start(inputs, spans)
    common = min(inputs.common, n - 1)
    reused = common if inputs.frontier is None else min(common, inputs.frontier)
    if tail is not None:
        reused = min(reused, tail)  # a fresh server decodes the tail after the plan
    if inputs.source is SourceKind.MAIN and ranks(spans, n):
        reused = restart_for_rows(wanted_spans(inputs, spans, n, ranks), reused, c, lacking)
    if c.cell_order is CellOrder.CANONICAL and inputs.grid is not None:
        reused = inputs.grid.chunk_start(reused)  # on a fresh prefill's cells
    end = n if tail is None else tail
    wanted = wanted_spans(inputs, spans, end, ranks)
    lexical = lexical_spans(spans, c.query_max_tokens) if wanted else ()
    return TurnPlan(n, spans, common, reused, tail, wanted, lexical)


def resolve_spans(given: PromptSpans, n: int, config: KVMemConfig) -> PromptSpans:
    """The spans by `--kvmem-query-policy`: `tail` scores the prompt's tail; `user` and
    `agent` the task (and `agent` the trajectory's tail too); with no user message the
    query is the prompt's own tail."""
    spans = given.clipped(n)
    tail = TokenSpan(max(0, n - config.query_max_tokens), n)
    if config.query_policy is QueryPolicy.TAIL or spans.query is None:
        return replace(spans, query=tail, live=spans.live or tail)
    return spans


def deferred_start(inputs: TurnInputs, spans: PromptSpans) -> int | None:
    """Where the prompt's tail starts when it is decoded only after the window is chosen
    for it, or None. With `--kvmem-query-source scoring` the query vectors come from the
    scoring context, so the tail that would be replayed against the chosen window (the
    pinned query, from the last message on) is decoded once, after the plan, instead of
    twice. Block-aligned, so every block before it is complete when the plan is made; a
    function of the request alone. Not for a prompt that fits the budget (nothing is
    chosen), nor on a hybrid or with images (their prefill has checkpoints and groups of
    its own)."""
    n, c = inputs.n, inputs.config
    if inputs.source is not SourceKind.SCORING or inputs.hybrid or spans.groups:
        return None
    if n <= c.budget or c.query_replay is QueryReplay.OFF:
        return None
    bt = c.block_tokens
    live = spans.live.start if spans.live is not None else 0
    start = max(live, n - c.query_pin_tokens, 1)
    start -= start % bt
    return start if 0 < start < n else None


def wanted_spans(
    inputs: TurnInputs, spans: PromptSpans, end: int, ranks: Ranks
) -> tuple[TokenSpan, ...]:
    """The token spans whose query vectors score the blocks of the plan made at `end`.
    None when that plan ranks nothing (everything fits) and the rows come from the
    scoring context: they are a function of the tokens, computed when a plan needs them.
    The main context's rows are captured regardless: a later turn cannot recompute them
    for a span it does not decode."""
    if inputs.source is SourceKind.NONE or spans.query is None:
        return ()
    if inputs.source is SourceKind.SCORING and not ranks(spans, end):
        return ()
    q = inputs.config.query_max_tokens
    out = [spans.query.last(q)]
    if inputs.config.query_policy is QueryPolicy.AGENT and spans.trajectory is not None:
        traj = spans.trajectory.last(q)
        if traj.length and traj != out[0]:
            out.append(traj)
    return tuple(out)


def lexical_spans(spans: PromptSpans, max_tokens: int) -> tuple[TokenSpan, ...]:
    """The BM25 query: the task and the last message (a tool result, when the question
    arrives as one), the last `max_tokens` of each; never the trajectory between them,
    whose tool output matches every other round (lexical.py)."""
    parts = (s.last(max_tokens) for s in (spans.query, spans.live) if s is not None)
    return tuple(dict.fromkeys(s for s in parts if s.length))


def restart_for_rows(
    wanted: tuple[TokenSpan, ...], reused: int, config: KVMemConfig, lacking: Lacking
) -> int:
    """Where the prefill starts so that the plan has the main context's rows of every
    wanted span: `reused`, or the first position of a wanted span with no kept row (the
    tokens of an earlier turn's generation; a session loaded or switched back), at most
    `--kvmem-query-max-tokens` back. A span further back goes without (the QUERY trace
    says so)."""
    firsts = (lacking(s, reused) for s in wanted)
    near = [p for p in firsts if p is not None and reused - p <= config.query_max_tokens]
    return min(near, default=reused)
