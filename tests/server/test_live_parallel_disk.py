"""--parallel 2 with --kvmem-disk-dir, with real kvmem-server processes (SmolLM2).

A reference server (two lanes, RAM only) runs A1 B1 A2 B2 A3 B3. The disk server runs
A1 B1 A2 B2 (A lands on lane 0, B on lane 1), is killed with SIGKILL once both lanes'
manifests are written (lane 0's in DIR, lane 1's in DIR/lane-1), and a restart on the
same directory finds both: A3 and B3 are routed to the lanes that stored them, reuse the
stored histories (cached tokens) and answer exactly as the reference.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server.conftest import start_server
from tests.server.test_live_conversations_disk import (
    BLOCK,
    Conversation,
    cached,
    wait_stored,
)
from tests.server.test_live_disk_store import text

pytestmark = pytest.mark.slow

COMMON = ("-c", "4096", "--kvmem-budget", "1024", "--kvmem-gen-reserve", "512", "-t", "2")
COMMON += ("--parallel", "2", "--seed", "1")


@pytest.fixture(scope="module")
def reference(server_logs: Path) -> Iterator[list[str]]:
    server = start_server(COMMON, server_logs)
    a, b = Conversation("A"), Conversation("B")
    texts = [text(conv.turn(server, i)) for i in range(3) for conv in (a, b)]
    assert server.stop() == 0, server.log()[-3000:]
    yield texts  # A1 B1 A2 B2 A3 B3


def test_lanes_resume_their_conversations_after_kill(
    reference: list[str], server_logs: Path, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    disk = (*COMMON, "--kvmem-disk-dir", str(store))
    first = start_server(disk, server_logs)
    a, b = Conversation("A"), Conversation("B")
    got = [text(conv.turn(first, i)) for i in range(2) for conv in (a, b)]
    assert got == reference[:4]
    stored = [
        wait_stored(directory, ((conv.total_tokens - 1) // BLOCK) * BLOCK)
        for directory, conv in ((store, a), (store / "lane-1", b))
    ]
    assert min(stored) >= 2 * BLOCK
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(30)

    second = start_server(disk, server_logs)
    a3, b3 = a.turn(second, 2), b.turn(second, 2)
    assert [text(a3), text(b3)] == reference[4:6]
    assert cached(a3) >= stored[0] and cached(b3) >= stored[1]
    assert second.stop() == 0, second.log()[-3000:]
