"""Sessions that outlive the process: load a stored session at start, checkpoint each turn.

With `--kvmem-disk-dir DIR` the session's block store is a `TieredStore` (RAM over disk).
At the end of every turn `persist` queues a checkpoint behind the block writes: the writer
thread commits `DIR/session.kvm` (tokens of the complete blocks, each block file's digest,
the KV row layout and the fingerprint) once those blocks are durable, and saves the
retrieval summaries of blocks that have none yet. The open (partial) block is not stored:
after a restart its tokens are processed again.

At start `load` reads the manifest. A fingerprint that differs from this engine's (model
file, architecture and hparams, KV types, block size, positions mode, llama.cpp build, ...)
refuses the store in one log line and starts fresh. Otherwise every block file is read and
checked against the manifest's digest; the history is restored up to the first block that
is missing or damaged (a torn write: that block and the later ones are recomputed). The
blocks live in the store (RAM up to the cap, else on disk); the sink and the most recent
blocks that fit the budget are restored into the context, so the next request sharing the
prefix only processes its suffix.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict
from typing import Any

import llama_cpp
import numpy as np

from kvmem.config import KVCacheTypes, KVMemConfig
from kvmem.errors import ConfigError, StoreCorruptError
from kvmem.gguf.model_path import model_file_identity
from kvmem.memory.ggml_types import GgmlType
from kvmem.memory.retrieval_index import BlockKeys
from kvmem.memory.session_manifest import (
    MANIFEST_NAME,
    SessionManifest,
    read_manifest,
    read_summary,
    write_manifest,
    write_summary,
)
from kvmem.memory.summary_table import N_STATS
from kvmem.memory.tiered_store import MIB, TieredStore, read_block_file

from ..llama.model import ModelInfo
from ..session.session import KVMemSession
from ..trace import TraceKind, Tracer
from ..transfer.state_codec import LayerLayout, StateLayout

logger = logging.getLogger(__name__)


def open_tiered_store(config: KVMemConfig) -> TieredStore | None:
    """The block store for `--kvmem-disk-dir` (None without one); locks the directory."""
    if config.disk_dir is None:
        return None
    try:
        return TieredStore(
            config.disk_dir,
            ram_cap_bytes=config.host_mib * MIB,
            disk_cap_bytes=config.disk_mib * MIB,
        )
    except OSError as exc:
        raise ConfigError(
            "--kvmem-disk-dir", f"cannot use {config.disk_dir}: {exc.strerror or exc}"
        ) from None


def llama_build() -> str:
    info = llama_cpp.llama_print_system_info()
    text = info.decode("utf-8", "replace") if isinstance(info, bytes) else str(info)
    return f"llama-cpp-python {llama_cpp.__version__}; {text.strip()}"


def store_fingerprint(
    info: ModelInfo,
    config: KVMemConfig,
    cache_types: KVCacheTypes,
    flash_attn: bool,
    k_rotation: int,
    score_layers: tuple[int, ...],
) -> dict[str, str]:
    """Everything the stored bytes (and their summaries) depend on, as strings."""
    size, digest = model_file_identity(info.path)
    return {
        "model_size": str(size),
        "model_digest": digest,
        "arch": info.arch,
        "hparams": (
            f"n_layer={info.n_layer} n_embd={info.n_embd} n_head={info.n_head} "
            f"n_head_kv={info.n_head_kv} head_dim={info.head_dim} n_vocab={info.n_vocab}"
        ),
        "rope": "none" if info.rope is None else repr(info.rope),
        "cache_type_k": cache_types.k.label,
        "cache_type_v": cache_types.v.label,
        "flash_attn": str(flash_attn),
        "k_rotation": str(k_rotation),
        "block_tokens": str(config.block_tokens),
        "positions": config.positions.value,
        "method": config.method.value,
        "score_layers": ",".join(map(str, score_layers)),
        "llama_cpp": llama_build(),
    }


def _layout_json(layout: StateLayout) -> dict[str, Any]:
    return {
        "v_trans": layout.v_trans,
        "layers": [
            {**asdict(lay), "k_type": int(lay.k_type), "v_type": int(lay.v_type)}
            for lay in layout.layers
        ],
    }


def _layout_from_json(data: dict[str, Any]) -> StateLayout:
    layers = tuple(
        LayerLayout(
            k_type=GgmlType(int(d["k_type"])),
            k_row_bytes=int(d["k_row_bytes"]),
            v_type=GgmlType(int(d["v_type"])),
            v_row_bytes=int(d["v_row_bytes"]),
            v_el_bytes=int(d["v_el_bytes"]),
        )
        for d in data["layers"]
    )
    return StateLayout(v_trans=bool(data["v_trans"]), layers=layers)


def initial_window(config: KVMemConfig, n_blocks: int) -> list[int]:
    """The sink blocks and the most recent blocks that fit the budget (all at their own
    positions): the window a long prefill leaves, for a session that has none yet."""
    slots = max(1, config.budget // config.block_tokens)
    sink = list(range(min(config.sink_blocks, n_blocks, slots)))
    recent = [b for b in range(n_blocks - 1, -1, -1) if b not in sink][: slots - len(sink)]
    return sorted(sink + recent)


class SessionPersister:
    """Loads and checkpoints one session in its TieredStore's directory."""

    def __init__(
        self,
        session: KVMemSession,
        store: TieredStore,
        fingerprint: dict[str, str],
        tracer: Tracer,
    ) -> None:
        self.session = session
        self.store = store
        self.fingerprint = fingerprint
        self.tracer = tracer
        self.directory = store.directory
        self.loaded_tokens = 0
        self.extra: dict[str, Any] = {}  # written with each checkpoint (a pool's fields)
        self.loaded_extra: dict[str, Any] = {}  # what the loaded manifest held
        self._committed: tuple[int, tuple[bytes, ...], str] | None = None
        self._warned_degraded = False

    # start -------------------------------------------------------------------------------
    def load(self) -> int:
        """Restore the stored session if it matches; returns the tokens restored."""
        t0 = time.perf_counter()
        try:
            manifest = read_manifest(self.directory)
        except StoreCorruptError as exc:
            logger.warning(
                "kvmem session store %s refused: %s; starting fresh", self.directory, exc
            )
            self._wipe()
            return 0
        if manifest is None:
            logger.info("kvmem session store %s: no stored session", self.directory)
            self._wipe()
            return 0
        diff = [
            f"{k}: stored {manifest.fingerprint.get(k, '-')!r}, now {v!r}"
            for k, v in self.fingerprint.items()
            if manifest.fingerprint.get(k) != v
        ]
        if diff:
            logger.warning(
                "kvmem session store %s refused: fingerprint mismatch (%s); starting fresh",
                self.directory,
                "; ".join(diff),
            )
            self._wipe()
            return 0
        n_ok = self._adopt_blocks(manifest)
        self.loaded_tokens = n_ok * manifest.block_tokens
        self.loaded_extra = manifest.extra
        self._restore_frontier(manifest.extra.get("frontier"))
        ms = (time.perf_counter() - t0) * 1e3
        logger.info(
            "kvmem session store %s: restored %d tokens (%d of %d blocks) in %.0f ms",
            self.directory,
            self.loaded_tokens,
            n_ok,
            manifest.n_blocks,
            ms,
        )
        self.tracer.emit(
            TraceKind.LOAD,
            tokens=self.loaded_tokens,
            blocks=n_ok,
            stored_blocks=manifest.n_blocks,
            recomputed_blocks=manifest.n_blocks - n_ok,
            ms=ms,
        )
        return self.loaded_tokens

    def _adopt_blocks(self, manifest: SessionManifest) -> int:
        s, bt = self.session, manifest.block_tokens
        n_ok, summaries, missing = 0, {}, []
        if s.index is not None:
            g = s.index.geometry
            shape = (N_STATS, len(s.index.layers), g.n_head_kv, g.head_dim)
        for b, digest in enumerate(manifest.digests):
            try:
                block, got, size = read_block_file(self.directory, b)
            except (OSError, StoreCorruptError) as exc:
                logger.warning(
                    "kvmem stored block %d is unusable (%s): recomputing from it", b, exc
                )
                break
            expected = np.arange(b * bt, (b + 1) * bt, dtype=np.int32)  # [bt]
            if got != digest or not np.array_equal(block.positions, expected):
                logger.warning("kvmem stored block %d is another version: recomputing from it", b)
                break
            self.store.adopt(block, got, size)
            if s.index is not None:
                summary = read_summary(self.directory, b, got)
                if summary is not None and summary.shape == shape:
                    summaries[b] = summary
                else:
                    missing.append(BlockKeys(b, block.positions, block.k))
            n_ok += 1
        stale = [b for b in self.store.block_ids() if b >= n_ok]
        self.store.drop(stale)
        self._remove_files_from(n_ok)
        if n_ok == 0:
            return 0
        s.window.adopt(manifest.tokens[: n_ok * bt].tolist(), range(n_ok))
        s.transfer.layout = _layout_from_json(manifest.layout)
        if s.index is not None:
            if summaries:
                ids = sorted(summaries)
                s.index.put(ids, np.stack([summaries[b] for b in ids]))
                for b, v in zip(ids, self.store.versions(ids), strict=True):
                    self.store.mark_summary_saved(b, v)
            if missing:
                s.index.add_blocks(missing)
        s.window.restore_own(initial_window(s.config, n_ok))
        s.window.note_peak()
        return n_ok

    def _restore_frontier(self, frontier: object) -> None:
        """Tokens from the stored frontier saw a chosen window: the next turn recomputes
        them, as the process that stored them would have."""
        if isinstance(frontier, int) and 0 <= frontier < self.loaded_tokens:
            self.session.frontier = frontier
            logger.info("kvmem session store: tokens from %d are recomputed (frontier)", frontier)

    def _wipe(self) -> None:
        """Start fresh: forget the stored manifest and block files."""
        (self.directory / MANIFEST_NAME).unlink(missing_ok=True)
        self._remove_files_from(0)

    def _remove_files_from(self, first: int) -> None:
        for path in self.store.blocks_dir.glob("b*.*"):
            try:
                block_id = int(path.name[1:9])
            except ValueError:
                continue
            if block_id >= first and block_id not in self.store:
                path.unlink(missing_ok=True)

    # end of a turn -----------------------------------------------------------------------
    def persist(self) -> None:
        """Queue a checkpoint of the complete blocks (written once they are durable)."""
        if self.store.degraded:
            if not self._warned_degraded:
                logger.warning(
                    "kvmem session store %s: no more checkpoints (disk tier degraded)",
                    self.directory,
                )
                self._warned_degraded = True
            return
        s = self.session
        bt = s.table.block_tokens
        ids = [b for b in range(s.table.n_complete_blocks) if b in self.store]
        n = next((i for i, b in enumerate(ids) if b != i), len(ids))  # contiguous prefix
        ids = ids[:n]
        versions = self.store.versions(ids)
        tokens = s.table.token_array()[: n * bt].astype(np.int32)  # [n * bt], a copy
        layout = _layout_json(s.transfer.layout) if s.transfer.layout is not None else {}
        summaries: dict[int, np.ndarray] = {}
        if s.index is not None:
            need = [b for b in self.store.summaries_needed(ids) if b in s.index]
            if need:
                stacked = s.index.stats(need)  # [n_need, 3, n_scored, n_kv, hd]
                summaries = {b: stacked[i] for i, b in enumerate(need)}
        vmap = dict(zip(ids, versions, strict=True))
        extra = {**self.extra, "frontier": s.frontier}
        extra_key = json.dumps(extra, sort_keys=True)

        def job(store: TieredStore) -> None:
            digests: list[bytes] = []
            for b in ids:
                d = store.disk_digest(b, vmap[b])
                if d is None:
                    break
                digests.append(d)
            k = len(digests)
            key = (k, tuple(digests), extra_key)
            if key == self._committed:
                return
            try:
                for b, summary in summaries.items():
                    if b < k:
                        write_summary(self.directory, b, digests[b], summary)
                        store.mark_summary_saved(b, vmap[b])
                write_manifest(
                    self.directory,
                    SessionManifest(self.fingerprint, bt, tokens[: k * bt], digests, layout, extra),
                )
            except OSError as exc:
                logger.warning("kvmem session checkpoint failed: %s", exc.strerror or exc)
                return
            self._committed = key
            store.tier.checkpoints += 1
            store.tier.checkpoint_tokens = k * bt
            self.tracer.emit(TraceKind.CHECKPOINT, tokens=k * bt, blocks=k, of_blocks=len(ids))

        self.store.checkpoint(job)

    def emit_tier(self) -> None:
        t, st = self.store.tier, self.store
        self.tracer.emit(
            TraceKind.TIER,
            ram_hits=t.ram_hits,
            ram_misses=t.ram_misses,
            ram_blocks=st.ram_blocks,
            ram_bytes=st.ram_bytes,
            disk_blocks=st.disk_blocks,
            disk_bytes=st.disk_bytes,
            read_bytes=t.disk_read_bytes,
            write_bytes=t.disk_write_bytes,
            degraded=int(st.degraded is not None),
        )


__all__ = ["SessionPersister", "initial_window", "open_tiered_store", "store_fingerprint"]
