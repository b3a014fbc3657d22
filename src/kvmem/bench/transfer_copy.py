"""`kvmem-bench transfer-copy`: the host side of restore and harvest, native against numpy.

No model and no GPU: blocks of random bytes at a model's KV shape (default: the 8B Llama
shape, 32 layers x 1,024 K and V channels, q8_0 rows, 128-token blocks) are

- built into one restore blob (what `llama_state_seq_set_data` reads), in a reused
  buffer, as `KVTransfer.restore` does: `build` GB/s;
- split from one harvest blob into per-block buffers touched ahead, as `KVTransfer.harvest`
  does (numpy: `split_blocks` + `owned_block` per block on the copy threads; native: one
  `kv_copy` call on a copy thread): `split` GB/s;

for each `--copy` path in this one run, with the ratio to the first, a byte comparison of
every path's output with the first's, and the longest time the main thread was kept from
running (it spins on the clock while the split runs on the copy thread: a copy that holds
the GIL shows up here, as it would between two decodes of a prefill).
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from kvmem.bench.report import format_table, machine_description, write_json
from kvmem.cli.kvmem_flags import strict_int
from kvmem.engine.transfer.harvest_split import owned_block, split_owned
from kvmem.engine.transfer.kv_copy import NativeCopy, copy_threads, native_copy
from kvmem.engine.transfer.state_codec import (
    LayerLayout,
    StateLayout,
    build_state,
    kv_part_nbytes,
    parse_state,
    split_blocks,
)
from kvmem.errors import KVMemError
from kvmem.memory.ggml_types import GgmlType
from kvmem.memory.host_store import BlockKV

ROW_BYTES_PER_32 = {"f16": 64, "q8_0": 34, "q4_0": 18}  # bytes of 32 elements


@dataclass(slots=True)
class PathResult:
    copy: str
    build_ms: float
    split_ms: float
    stall_ms: float  # the longest the main thread waited for the GIL during the split
    identical: bool


class Prefaulted:
    """Destination buffers touched ahead (as BlockBuffers hands them out), reused per run."""

    def __init__(self, n_bytes: int, count: int) -> None:
        self._buffers = [np.ones(n_bytes, dtype=np.uint8) for _ in range(count)]  # [n_bytes]
        self._next = 0

    def take(self, n_bytes: int) -> np.ndarray:
        buf = self._buffers[self._next % len(self._buffers)]
        self._next += 1
        return buf[:n_bytes]


def _layout(ns: argparse.Namespace) -> StateLayout:
    row = ns.n_embd_kv // 32 * ROW_BYTES_PER_32[ns.kv]
    v_row, el = (ns.n_embd_kv * 2, 2) if ns.v_trans else (row, 0)
    v_type = GgmlType.F16 if ns.v_trans else GgmlType[ns.kv.upper()]
    layer = LayerLayout(GgmlType[ns.kv.upper()], row, v_type, v_row, el)
    return StateLayout(bool(ns.v_trans), (layer,) * ns.n_layer)


def _blocks(layout: StateLayout, n_blocks: int, bt: int) -> list[BlockKV]:
    """Stored blocks: each in one buffer of its own, as the harvest leaves them."""
    rng = np.random.default_rng(0)
    cell = sum(lay.k_row_bytes + lay.v_row_bytes for lay in layout.layers)
    blocks = []
    for b in range(n_blocks):
        data = rng.integers(0, 256, bt * cell, dtype=np.uint8)  # [bt * cell]
        views, at = [], 0
        for row in [lay.k_row_bytes for lay in layout.layers] + [
            lay.v_row_bytes for lay in layout.layers
        ]:
            views.append(data[at : at + bt * row].reshape(bt, row))
            at += bt * row
        n = len(layout.layers)
        positions = np.arange(b * bt, (b + 1) * bt, dtype=np.int32)  # [bt]
        blocks.append(BlockKV(b, positions, views[:n], views[n:]))
    return blocks


def _spin_while(jobs: list[Future]) -> float:
    """Spin on the clock until `jobs` are done; the longest gap between two looks (ms)."""
    worst, last = 0.0, time.perf_counter()
    while not all(j.done() for j in jobs):
        now = time.perf_counter()
        worst, last = max(worst, now - last), now
    return worst * 1e3


def _measure(ns, layout, blocks, native: NativeCopy | None, pool: ThreadPoolExecutor):
    """(build ms, split ms, stall ms, blob, split blocks) of the best of ns.repeat runs."""
    bt = ns.block_tokens
    n_bytes = 8 + kv_part_nbytes(layout, sum(b.n_tokens for b in blocks))
    out = np.ones(n_bytes, dtype=np.uint8)  # [n_bytes], reused (as the staging buffer)
    cell = sum(lay.k_row_bytes + lay.v_row_bytes for lay in layout.layers)
    dst = Prefaulted(bt * cell, len(blocks))
    best = (float("inf"), float("inf"), 0.0)
    split: list[BlockKV] = []
    for _ in range(ns.repeat):
        t0 = time.perf_counter()
        copier = pool if native is None and ns.threads > 1 else None
        build_state(layout, blocks, 2, out=out, copier=copier, native=native)
        build_ms = (time.perf_counter() - t0) * 1e3
        t0 = time.perf_counter()
        state = parse_state(out, transpose_v=native is None)
        if native is None:
            views = split_blocks(state, bt)
            jobs = [pool.submit(owned_block, b, dst) for b in views]  # type: ignore[arg-type]
            stall = _spin_while(jobs)
            split = [j.result() for j in jobs]
        else:
            plan = native.plan()
            split = split_owned(state, bt, dst.take, plan)
            job = pool.submit(plan.run)
            stall = _spin_while([job])
            job.result()
        split_ms = (time.perf_counter() - t0) * 1e3
        best = (min(best[0], build_ms), min(best[1], split_ms), max(best[2], stall))
    split_bytes = b"".join(a.tobytes() for b in split for a in [*b.k, *b.v])
    return best, out.copy(), split_bytes


def run(ns: argparse.Namespace) -> int:
    layout = _layout(ns)
    blocks = _blocks(layout, ns.blocks, ns.block_tokens)
    kv_bytes = sum(a.nbytes for b in blocks for a in [*b.k, *b.v])
    pool = ThreadPoolExecutor(max(1, ns.threads), "kvmem-copy")
    results: list[PathResult] = []
    first: tuple[np.ndarray, bytes] | None = None
    for copy in ns.copy:
        native = native_copy(ns.threads) if copy == "native" else None
        if copy == "native" and native is None:
            raise KVMemError(
                "the native copy is unavailable (no C compiler, or KVMEM_NATIVE_COPY=0)"
            )
        (build_ms, split_ms, stall_ms), blob, split = _measure(ns, layout, blocks, native, pool)
        first = first or (blob, split)
        same = np.array_equal(first[0], blob) and first[1] == split
        results.append(PathResult(copy, build_ms, split_ms, stall_ms, same))
    pool.shutdown()
    base = results[0]
    rows = [
        [r.copy, f"{kv_bytes / (r.build_ms * 1e6):.2f}", f"{r.build_ms:.0f}",
         f"{base.build_ms / r.build_ms:.2f}", f"{kv_bytes / (r.split_ms * 1e6):.2f}",
         f"{r.split_ms:.0f}", f"{base.split_ms / r.split_ms:.2f}", f"{r.stall_ms:.1f}",
         "yes" if r.identical else "NO"]
        for r in results
    ]  # fmt: skip
    head = ["copy", "build GB/s", "build ms", "build x", "split GB/s", "split ms", "split x",
            "main stall ms", f"bytes = {base.copy}"]  # fmt: skip
    title = (
        f"transfer copy: {ns.blocks} blocks x {ns.block_tokens} tokens, {ns.n_layer} layers, "
        f"{ns.kv}{' V transposed' if ns.v_trans else ''}, {kv_bytes / 1e9:.2f} GB, "
        f"{ns.threads} copy threads, best of {ns.repeat}"
    )
    print(format_table(head, rows, title))
    if ns.out:
        payload = {"machine": machine_description(), "kv_bytes": kv_bytes,
                   "args": {k: v for k, v in vars(ns).items() if k != "handler"},
                   "results": results}  # fmt: skip
        write_json(ns.out, "transfer_copy.json", payload)
    return 0 if all(r.identical for r in results) else 1


def _copies(text: str) -> list[str]:
    names = [x for x in text.split(",") if x]
    if not names or any(n not in ("native", "numpy") for n in names):
        raise argparse.ArgumentTypeError(f"expected native and/or numpy, got {text!r}")
    return names


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "transfer-copy", help="restore-blob build and harvest split GB/s, native vs numpy (CPU)"
    )
    p.add_argument("--copy", type=_copies, default=["numpy", "native"], metavar="P,P",
                   help="paths in order; ratios are to the first (default numpy,native)")  # fmt: skip
    p.add_argument("--blocks", type=strict_int, default=180, help="blocks restored/harvested")
    p.add_argument("--block-tokens", type=strict_int, default=128)
    p.add_argument("--n-layer", type=strict_int, default=32)
    p.add_argument("--n-embd-kv", type=strict_int, default=1024, help="K (and V) channels")
    p.add_argument("--kv", choices=sorted(ROW_BYTES_PER_32), default="q8_0")
    p.add_argument("--v-trans", action="store_true", help="f16 V transposed (no flash attn)")
    p.add_argument("--threads", type=strict_int, default=copy_threads(), help="copy threads")
    p.add_argument("--repeat", type=strict_int, default=3)
    p.add_argument("--out", default=None, metavar="DIR")
    p.set_defaults(handler=run)
