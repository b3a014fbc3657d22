"""The prompt's prefill: block-aligned chunks, each seeing the stream window of its
position, with the main context's query rows captured for the spans asked."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from kvmem.memory.spans import PromptSpans, TokenSpan

from ..query.query_cache import SpanRows
from ..trace import TurnStats
from ..transfer.transfer_profile import TransferPath
from .decode import ChunkRunner
from .window_plans import StreamAt


def prefill_chunks(
    runner: ChunkRunner,
    tokens: list[int],
    spans: PromptSpans,
    capture: tuple[TokenSpan, ...],
    stats: TurnStats,
    on_chunk: Callable[[], None] | None = None,
    inside_last: Callable[[], None] | None = None,
) -> SpanRows:
    """Decode the prompt's `tokens` after the history; returns the rows captured of each
    span of `capture` (layer -> [tokens, dim], the part this prefill decoded). `on_chunk`
    runs after each chunk is recorded; the last chunk is decoded and recorded ubatch by
    ubatch when `inside_last` is given, which runs after each (both: the query work ahead,
    whose candidates may complete and whose scores may land inside the last chunk)."""
    grid, window = runner.grid, runner.window
    captured: dict[TokenSpan, dict[int, list[np.ndarray]]] = {}

    def recorded(piece: list[int], end: bool) -> None:
        runner.record(piece, stats, harvest=end)  # harvests as the chunk recorded whole
        if inside_last is not None:
            inside_last()

    c0 = 0
    while c0 < len(tokens):
        t_loop = time.perf_counter()
        pos = runner.table.n_tokens
        # up to the next chunk boundary, or a ReplaySSM snapshot point before it
        size = runner.recurrent.chunk_size(pos, grid.chunk_tokens - pos % grid.chunk_tokens)
        chunk = tokens[c0 : c0 + size]
        runner.check_cancel()
        if runner.bounded:
            room = window.capacity - grid.chunk_tokens
            at = StreamAt(pos, spans, room, grid.stream_grid)
            stats.add(window.apply_stream(window.plan_stream(at)))
        window.note_decode()
        live = [s for s in capture if pos < s.end and pos + len(chunk) > s.start]
        t_decode, net0 = time.perf_counter(), runner.profile.net_mark()
        last = c0 + len(chunk) == len(tokens)
        if last and inside_last is not None:  # recorded by ubatch, `inside_last` after each
            got = runner.run_pieces(chunk, pos, last, bool(live), recorded)
        else:
            got = runner.run(chunk, pos, False, last, bool(live))
            runner.record(chunk, stats)
        decode_ms = (time.perf_counter() - t_decode) * 1e3
        for span in live:
            lo, hi = max(span.start, pos) - pos, min(span.end, pos + len(chunk)) - pos
            for layer, data in got.items():
                captured.setdefault(span, {}).setdefault(layer, []).append(data[lo:hi])
        if on_chunk is not None:
            on_chunk()
        c0 += len(chunk)
        net = runner.profile.net_mark() - net0  # bytes to the RPC workers (0 without)
        runner.profile.add(TransferPath.PREFILL_DECODE, decode_ms, net_bytes=net)
        loop_ms = (time.perf_counter() - t_loop) * 1e3
        runner.profile.add(TransferPath.PREFILL_GAP, loop_ms - decode_ms)
    return {s: {k: np.concatenate(v) for k, v in d.items()} for s, d in captured.items()}
