"""Plain llama.cpp decode of N sequences, no KVMem: the two lane designs side by side.

`kvmem-bench lanes` measures KVMem's lanes (one context each, engine/lanes.py) and, as a
baseline without KVMem, the two ways llama.cpp can run N concurrent generations:

- `one_context`: N sequence ids in ONE context; every step is one `llama_decode` of N
  rows (row i: sequence i's last token), so the N decodes are batched;
- `n_contexts`: N contexts over the same model, each decoding its own sequence one token
  per `llama_decode` on its own thread (what KVMem's lanes do).

Both prefill each prompt first (not timed), then generate `gen_tokens` greedy tokens per
sequence (end-of-generation tokens banned); aggregate tok/s = N x gen_tokens / the decode
wall time. The contexts have `cells` KV cells per sequence and the same KV types, flash
attention and threads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import llama_cpp
import numpy as np

from kvmem.errors import DecodeError

from .context import ContextSettings, LlamaContext
from .model import LlamaModel


@dataclass(slots=True)
class BaselineRun:
    design: str  # "one_context" | "n_contexts"
    sequences: int
    tokens: int
    seconds: float
    outputs: list[list[int]] = field(default_factory=list)  # per sequence, the greedy tokens

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


class _SeqBatch:
    """A llama_batch whose rows carry explicit (token, position, sequence)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.raw = llama_cpp.llama_batch_init(capacity, 0, 1)

    def decode(self, ctx: LlamaContext, rows: Sequence[tuple[int, int, int, bool]]) -> None:
        raw = self.raw
        raw.n_tokens = len(rows)
        for i, (token, pos, seq, logits) in enumerate(rows):
            raw.token[i], raw.pos[i], raw.n_seq_id[i] = token, pos, 1
            raw.seq_id[i][0] = seq
            raw.logits[i] = 1 if logits else 0
        rc = llama_cpp.llama_decode(ctx.ptr, raw)
        if rc != 0:
            raise DecodeError(f"llama_decode failed with code {rc} (seq-id baseline)")

    def free(self) -> None:
        llama_cpp.llama_batch_free(self.raw)


def _greedy(ctx: LlamaContext, model: LlamaModel, row: int) -> int:
    """The argmax of output row `row`, end-of-generation tokens banned (read in place: a
    copy only when an EOG token has to be masked)."""
    ptr = llama_cpp.llama_get_logits_ith(ctx.ptr, row)
    if not ptr:
        raise DecodeError(f"no logits for output {row} (seq-id baseline)")
    logits = np.ctypeslib.as_array(ptr, shape=(ctx.n_vocab,))  # [n_vocab], a view
    token = int(np.argmax(logits))
    if model.is_eog(token):
        logits = logits.copy()  # [n_vocab]
        while model.is_eog(token):
            logits[token] = -np.inf
            token = int(np.argmax(logits))
    return token


def _prefill(ctx: LlamaContext, batch: _SeqBatch, prompt: Sequence[int], seq: int, row: int):
    """Decode `prompt` on `seq`; returns its first generated token."""
    last = len(prompt) - 1
    batch.decode(ctx, [(t, p, seq, p == last) for p, t in enumerate(prompt)])
    return _greedy(ctx, ctx.model, row)


def one_context(
    model: LlamaModel, settings: ContextSettings, prompts: list[list[int]], gen_tokens: int
) -> BaselineRun:
    """N sequence ids in one context, one batched llama_decode per step."""
    n = len(prompts)
    cells = settings.n_cells
    ctx = LlamaContext(model, _with(settings, n_cells=cells * n, n_seq_max=n))
    batch = _SeqBatch(max(n, *(len(p) for p in prompts)))
    try:
        nexts = [_prefill(ctx, batch, p, seq, -1) for seq, p in enumerate(prompts)]
        outputs = [[t] for t in nexts]
        pos = [len(p) for p in prompts]
        t0 = time.perf_counter()
        for _ in range(gen_tokens - 1):
            batch.decode(ctx, [(nexts[s], pos[s], s, True) for s in range(n)])
            nexts = [_greedy(ctx, model, s) for s in range(n)]  # row s: sequence s
            for s in range(n):
                outputs[s].append(nexts[s])
            pos = [p + 1 for p in pos]
        seconds = time.perf_counter() - t0
    finally:
        batch.free()
        ctx.close()
    return BaselineRun("one_context", n, n * (gen_tokens - 1), seconds, outputs)


def n_contexts(
    model: LlamaModel, settings: ContextSettings, prompts: list[list[int]], gen_tokens: int
) -> BaselineRun:
    """N contexts, each decoding its sequence on its own thread."""
    n = len(prompts)
    spans: list[tuple[float, float]] = [(0.0, 0.0)] * n
    outputs: list[list[int]] = [[] for _ in range(n)]
    barrier = threading.Barrier(n)

    def worker(i: int) -> None:
        ctx = LlamaContext(model, _with(settings, n_seq_max=1))
        batch = _SeqBatch(len(prompts[i]))
        try:
            token = _prefill(ctx, batch, prompts[i], 0, -1)
            outputs[i].append(token)
            pos = len(prompts[i])
            barrier.wait()
            t0 = time.perf_counter()
            for _ in range(gen_tokens - 1):
                batch.decode(ctx, [(token, pos, 0, True)])
                token = _greedy(ctx, model, 0)
                outputs[i].append(token)
                pos += 1
            spans[i] = (t0, time.perf_counter())
        finally:
            batch.free()
            ctx.close()

    run_threads(worker, n, barrier)
    seconds = max(end for _, end in spans) - min(start for start, _ in spans)
    return BaselineRun("n_contexts", n, n * (gen_tokens - 1), seconds, outputs)


def run_threads(
    target: Callable[[int], None], n: int, barrier: threading.Barrier | None = None
) -> None:
    """target(0) .. target(n - 1) on n threads; the first error is raised after the join
    (and breaks `barrier`, so that the others do not wait for the failed one)."""
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            target(i)
        except BaseException as exc:  # reported after the join
            errors.append(exc)
            if barrier is not None:
                barrier.abort()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def agreeing_prefix(a: list[list[int]], b: list[list[int]]) -> int:
    """The fewest leading tokens on which two runs' sequences agree (greedy: the batched
    rows may round differently, so the two designs can part after a while)."""
    out = []
    for x, y in zip(a, b, strict=True):
        m = min(len(x), len(y))
        differ = [i for i in range(m) if x[i] != y[i]]
        out.append(differ[0] if differ else m)
    return min(out) if out else 0


def baseline_settings(lane: ContextSettings, cells: int) -> ContextSettings:
    """A lane context's settings with `cells` cells (a multiple of 256) per sequence."""
    return replace(lane, n_cells=-(-cells // 256) * 256)


def _with(settings: ContextSettings, **changes: int) -> ContextSettings:
    return replace(settings, **changes)
