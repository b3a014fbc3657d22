"""Conversations that outlive the process: `--kvmem-disk-dir` with `--kvmem-conversations N`.

DIR (locked for the process' life) holds one store per conversation slot:

    DIR/lock
    DIR/conversation-<k>/{lock, session.kvm, blocks/}    k = 0 .. N-1

Each slot is a `TieredStore` with its own `SessionPersister`, exactly the single-session
layout one level down (`--kvmem-host-mib` and `--kvmem-disk-mib` cap each slot's tiers).
A slot's manifest also records the conversation's first-prompt length (the routing rule's
"continues" bound) and when it was last used (the LRU order), so that after a restart the
pool finds its conversations again, inactive, and routes to them by prefix.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from kvmem.config import KVMemConfig
from kvmem.errors import ConfigError
from kvmem.memory.tiered_store import MIB, TieredStore, lock_directory

from ..session.session import KVMemSession
from ..trace import Tracer
from .session_persist import SessionPersister

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class StoredConversation:
    """What a slot's manifest restored."""

    tokens: int
    first_prompt_tokens: int
    last_used: float


class ConversationDisk:
    """The slot stores under DIR and their persisters."""

    def __init__(self, config: KVMemConfig, tracer: Tracer) -> None:
        assert config.disk_dir is not None
        self.config = config
        self.tracer = tracer
        self.root = Path(config.disk_dir)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            self._lock = lock_directory(self.root)
        except OSError as exc:
            raise ConfigError(
                "--kvmem-disk-dir", f"cannot use {self.root}: {exc.strerror or exc}"
            ) from None
        self.fingerprint: dict[str, str] = {}  # set by the engine once the model is known
        self.stores: dict[int, TieredStore] = {}

    def open_store(self, slot: int) -> TieredStore:
        try:
            store = TieredStore(
                self.root / f"conversation-{slot}",
                ram_cap_bytes=self.config.host_mib * MIB,
                disk_cap_bytes=self.config.disk_mib * MIB,
            )
        except OSError as exc:
            raise ConfigError(
                "--kvmem-disk-dir", f"cannot use {self.root}: {exc.strerror or exc}"
            ) from None
        self.stores[slot] = store
        return store

    def persister(self, session: KVMemSession) -> SessionPersister:
        assert isinstance(session.store, TieredStore)
        return SessionPersister(session, session.store, self.fingerprint, self.tracer)

    @staticmethod
    def load(persister: SessionPersister) -> StoredConversation | None:
        """Restore a slot's stored conversation (None: nothing usable stored)."""
        tokens = persister.load()
        if tokens == 0:
            return None
        extra = persister.loaded_extra
        first = extra.get("first_prompt_tokens")
        first = first if isinstance(first, int) and first > 0 else tokens
        used = extra.get("last_used")
        return StoredConversation(
            tokens=tokens,
            first_prompt_tokens=min(first, tokens),  # its first prompt's stored part
            last_used=float(used) if isinstance(used, (int, float)) else 0.0,
        )

    def close(self) -> None:
        for store in self.stores.values():
            store.close()
        self.stores.clear()
        self._lock.close()
