"""Where data movement spends its time: one timer per transfer path, with the bytes moved.

`KVTransfer` and `QueryCapture` record into a `TransferProfile`; the benches print it
(`kvmem-bench decode-sweep`, `tools`) so that every path's bandwidth is measured in the
run that reports the speed, not assumed. Timers are wall-clock around the call: a path
that waits for the GPU (state get/set) includes that wait.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol


class NetworkCounter(Protocol):
    """Bytes exchanged so far with the RPC workers (kvmem.engine.transfer.rpc_traffic.NetworkMeter)."""

    def total(self) -> int: ...


class TransferPath(Enum):
    """The steps of harvest, restore and eviction, and the query capture."""

    STATE_GET = "state_get"  # llama_state_seq_get_data: device -> host blob
    STATE_SPLIT = "state_split"  # parse the blob and cut it into blocks (Python/numpy)
    COPY_OUT = "copy_out"  # blocks copied out of the staging buffer (on the copy threads)
    COPY_WAIT = "copy_wait"  # waiting for copy-outs still running when their blocks are needed
    STORE_PUT = "store_put"  # blocks into the host store
    INDEX_ADD = "index_add"  # handing blocks to the retrieval index (summaries run async)
    STATE_BUILD = "state_build"  # the restore blob assembled from host blocks
    # the same, on the builder's thread beside the prefill (restore_ahead): not waited for
    STATE_BUILD_AHEAD = "state_build_ahead"
    AHEAD_WAIT = "ahead_wait"  # what a restore waited for a blob still being built ahead
    # (re)allocating the staging buffer (pinned on a GPU), inside state_get / state_build
    STAGING_GROW = "staging_grow"
    STATE_SET = "state_set"  # llama_state_seq_set_data: host blob -> device
    SEQ_CP = "seq_cp"
    SEQ_RM = "seq_rm"
    SEQ_ADD = "seq_add"
    CAPTURE = "capture"  # eval-callback calls (every graph node) and query reads
    PREFILL_DECODE = "prefill_decode"  # llama_decode of prefill chunks (wall, on the caller)
    # the caller's time in the prefill loop outside llama_decode: streaming the window
    # (harvest and evict, also timed above), table bookkeeping, waiting for the GIL
    PREFILL_GAP = "prefill_gap"
    SCORING_DECODE = "scoring_decode"  # the scoring context's decode of sink + query spans


@dataclass(slots=True)
class PathTiming:
    calls: int = 0
    ms: float = 0.0
    bytes: int = 0
    net_bytes: int = 0  # bytes that crossed the network to RPC workers meanwhile

    @property
    def gb_s(self) -> float | None:
        """Bandwidth in GB/s (1e9 bytes), or None when nothing was moved or timed."""
        if self.bytes <= 0 or self.ms <= 0:
            return None
        return self.bytes / (self.ms * 1e6)


@dataclass(slots=True)
class TransferProfile:
    paths: dict[TransferPath, PathTiming] = field(
        default_factory=lambda: {p: PathTiming() for p in TransferPath}
    )
    network: NetworkCounter | None = None  # set when layers live on RPC workers

    def net_mark(self) -> int:
        """The network byte counter now (0 without RPC workers): `add(net_bytes=)` takes
        the difference of two marks."""
        return self.network.total() if self.network is not None else 0

    @contextmanager
    def timed(self, path: TransferPath, n_bytes: int = 0, calls: int = 1) -> Iterator[None]:
        net0 = self.net_mark()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            ms = (time.perf_counter() - t0) * 1e3
            self.add(path, ms, n_bytes, calls, net_bytes=self.net_mark() - net0)

    def add(
        self, path: TransferPath, ms: float, n_bytes: int = 0, calls: int = 1, net_bytes: int = 0
    ) -> None:
        p = self.paths[path]
        p.calls += calls
        p.ms += ms
        p.bytes += n_bytes
        p.net_bytes += net_bytes

    def clear(self) -> None:
        for p in self.paths.values():
            p.calls, p.ms, p.bytes, p.net_bytes = 0, 0.0, 0, 0

    def snapshot(self) -> dict[str, dict[str, float | int | None]]:
        """{path: {calls, ms, bytes, gb_s}} for the paths that were used (plus net_bytes
        when layers live on RPC workers)."""
        out: dict[str, dict[str, float | int | None]] = {
            path.value: {"calls": t.calls, "ms": t.ms, "bytes": t.bytes, "gb_s": t.gb_s}
            for path, t in self.paths.items()
            if t.calls
        }
        if self.network is not None:
            for path, t in self.paths.items():
                if t.calls:
                    out[path.value]["net_bytes"] = t.net_bytes
        return out
