"""--kvmem-conversations with --kvmem-disk-dir, with real kvmem-server processes (SmolLM2).

A reference server (two conversations, RAM only) runs A1 B1 A2 B2 A3 B3. The disk server
runs A1 B1 A2 B2, is killed with SIGKILL once both conversations' manifests are written,
and a restart on the same directory (three slots now, and --kvmem-conversations-mib just
above A + B as the reference stored them) finds both again: A3 and B3 reuse their stored
histories and answer exactly as the reference; then C's first turn passes the cap and
evicts A, the least recently used, and only A.
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvmem.memory.session_manifest import read_manifest
from tests.server.conftest import LiveServer, start_server
from tests.server.test_live_disk_store import chat, metrics, text, user_turn

pytestmark = pytest.mark.slow

COMMON = ("-c", "4096", "--kvmem-budget", "1024", "--kvmem-gen-reserve", "512", "-t", "2")
COMMON += ("--metrics", "--kvmem-trace", "--seed", "1")
BLOCK, MIB = 128, 1 << 20
EVICTED = re.compile(r"conversation (\d+) evicted \(least recently used, ([^)]*)\)")


class Conversation:
    def __init__(self, name: str) -> None:
        self.name = name
        self.messages: list[dict[str, str]] = [{"role": "system", "content": "Be brief."}]
        self.total_tokens = 0

    def turn(self, server: LiveServer, i: int) -> dict:
        self.messages.append({"role": "user", "content": f"[{self.name}] {user_turn(i % 4)}"})
        body = chat(server, self.messages)
        self.messages.append({"role": "assistant", "content": text(body)})
        self.total_tokens = body["usage"]["total_tokens"]
        return body


def cached(body: dict) -> int:
    return body["usage"]["prompt_tokens_details"]["cached_tokens"]


@pytest.fixture(scope="module")
def reference(server_logs: Path) -> Iterator[tuple[list[str], float]]:
    server = start_server((*COMMON, "--kvmem-conversations", "2"), server_logs)
    a, b = Conversation("A"), Conversation("B")
    texts = [text(conv.turn(server, i)) for i in range(3) for conv in (a, b)]
    stored = metrics(server)["kvmem_host_store_bytes"]  # A's and B's complete blocks
    assert server.stop() == 0, server.log()[-3000:]
    yield texts, stored  # A1 B1 A2 B2 A3 B3


def wait_stored(directory: Path, min_tokens: int, timeout: float = 60.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        manifest = read_manifest(directory) if (directory / "session.kvm").exists() else None
        if manifest is not None and manifest.n_blocks * BLOCK >= min_tokens:
            return manifest.n_blocks * BLOCK
        time.sleep(0.1)
    raise AssertionError(f"{directory} never stored {min_tokens} tokens")


def test_conversations_survive_kill_and_the_cap_evicts_the_lru(
    reference: tuple[list[str], float], server_logs: Path, tmp_path: Path
) -> None:
    texts, stored_bytes = reference
    store = tmp_path / "store"
    disk = (*COMMON, "--kvmem-disk-dir", str(store))
    two = (*disk, "--kvmem-conversations", "2")

    first = start_server(two, server_logs)
    a, b = Conversation("A"), Conversation("B")
    got = [text(conv.turn(first, i)) for i in range(2) for conv in (a, b)]
    assert got == texts[:4]
    stored = [
        wait_stored(store / f"conversation-{k}", ((conv.total_tokens - 1) // BLOCK) * BLOCK)
        for k, conv in enumerate((a, b))
    ]
    assert min(stored) >= 2 * BLOCK
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(30)

    # restart: three slots, a cap just above A + B (the blocks are 2.8125 MiB each)
    cap = -(-int(stored_bytes) // MIB)
    second = start_server(
        (*disk, "--kvmem-conversations", "3", "--kvmem-conversations-mib", str(cap)), server_logs
    )
    assert f"conversations found in {store}: [0, 1]" in second.log()
    a3, b3 = a.turn(second, 2), b.turn(second, 2)
    assert [text(a3), text(b3)] == texts[4:6]
    assert cached(a3) >= stored[0] and cached(b3) >= stored[1]
    assert metrics(second)["kvmem_host_store_bytes"] == stored_bytes <= cap * MIB
    assert EVICTED.findall(second.log()) == []

    # C's first turn passes the cap: A (used before B) is evicted, and only A
    c = Conversation("C")
    assert cached(c.turn(second, 3)) == 0
    assert EVICTED.findall(second.log()) == [("0", "past --kvmem-conversations-mib")]
    m = metrics(second)
    assert m["kvmem_conversations_evicted_total"] == 1
    assert m["kvmem_host_store_bytes"] <= cap * MIB
    b4 = b.turn(second, 3)
    assert cached(b4) > stored[1]  # B stayed warm
    assert cached(a.turn(second, 3)) == 0  # A was forgotten: a new conversation
    assert second.stop() == 0, second.log()[-3000:]
