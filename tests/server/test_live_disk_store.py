"""Memory that outlives the process, with real kvmem-server processes (SmolLM2-135M).

One reference server (RAM only) and a chain of servers on one --kvmem-disk-dir, all with
a RAM cap below one block (--kvmem-host-mib 1), so every block lives on disk:
  1. three turns, kill -9; a restart with the same directory answers the 4th turn from
     the stored history (only the suffix is processed) exactly as the uninterrupted server;
  2. needle cases over the budget read their retrieved blocks through the disk tier and
     answer exactly as RAM-only;
  3. a damaged block file (a torn write) is detected and recomputed from there on;
  4. block writes that fail mid-run (directory read-only, file size limit) degrade to
     RAM-only with one warning and the server keeps answering the same;
  5. another -ctk refuses the store with the mismatch line and still answers.
"""

from __future__ import annotations

import os
import re
import resource
import signal
import stat
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kvmem.bench.needle_data import Layout, NeedleKind, NeedleSpec, build_case
from tests.server.conftest import LiveServer, start_server

pytestmark = pytest.mark.slow

COMMON = ("-c", "4096", "--kvmem-budget", "1024", "--kvmem-gen-reserve", "512", "-t", "2")
COMMON += ("--metrics", "--kvmem-trace", "--seed", "1")
# chunks of 1,152 (no 512 cap): a needle prompt's stream window holds 3 blocks, so the
# reselection retrieves the needle's blocks from the store
COMMON += ("--kvmem-chunk-tokens", "2048")
BLOCK = 128

TOPICS = ["a lighthouse keeper", "a copper mine", "a glacier survey", "a night market"]


def user_turn(i: int) -> str:
    return f"Write two sentences about {TOPICS[i]}. " + " ".join(
        f"Detail {i}.{j}: the {TOPICS[i]} story has part {j}." for j in range(12)
    )


def chat(server: LiveServer, messages: list[dict[str, str]], max_tokens: int = 16) -> dict:
    r = httpx.post(
        server.base_url + "/v1/chat/completions",
        json={"messages": messages, "max_tokens": max_tokens, "temperature": 0},
        timeout=600,
    )
    assert r.status_code == 200, r.text
    return r.json()


def conversation(server: LiveServer, turns: int, history: list | None = None) -> list[dict]:
    """Run `turns` turns (continuing `history`); returns the response bodies."""
    messages = history if history is not None else [{"role": "system", "content": "Be brief."}]
    bodies = []
    for i in range(len(bodies) + sum(m["role"] == "user" for m in messages), turns):
        messages.append({"role": "user", "content": user_turn(i)})
        body = chat(server, messages)
        messages.append({"role": "assistant", "content": body["choices"][0]["message"]["content"]})
        bodies.append(body)
    return bodies


def needle_messages(depth: float) -> list[dict[str, str]]:
    case = build_case(
        NeedleSpec(NeedleKind.PASSKEY, Layout.DOCUMENT, 1800, depth, 0), lambda t: len(t) // 4
    )
    return [{"role": m.role.value, "content": m.content} for m in case.messages]


def metrics(server: LiveServer) -> dict[str, float]:
    text = httpx.get(server.base_url + "/metrics", timeout=30).text
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(\S+) (\S+)$", text, re.M)}


def wait_for(server: LiveServer, pattern: str, timeout: float = 60.0) -> re.Match[str]:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = list(re.finditer(pattern, server.log()))
        if found:
            return found[-1]
        time.sleep(0.1)
    raise AssertionError(f"{pattern!r} not in the log:\n{server.log()[-3000:]}")


DEPTHS = (0.3, 0.6)


@pytest.fixture(scope="module")
def reference(server_logs: Path) -> Iterator[dict]:
    """An uninterrupted RAM-only server: 4 turns, the needle cases, the late turn."""
    server = start_server(COMMON, server_logs)
    bodies = conversation(server, 4)
    needles = [chat(server, needle_messages(d), 12) for d in DEPTHS]
    late = [chat(server, [{"role": "user", "content": user_turn(3)}]) for _ in range(2)]
    assert server.stop() == 0, server.log()[-3000:]
    yield {"turns": bodies, "needles": needles, "late": late}


def text(body: dict) -> str:
    return body["choices"][0]["message"]["content"]


def test_store_survives_kill_and_tiers_are_transparent(
    reference: dict, server_logs: Path, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    disk = (*COMMON, "--kvmem-disk-dir", str(store), "--kvmem-host-mib", "1")

    # 1. three turns, a checkpoint, kill -9
    first = start_server(disk, server_logs)
    history: list[dict[str, str]] = [{"role": "system", "content": "Be brief."}]
    bodies = conversation(first, 3, history)
    assert [text(b) for b in bodies] == [text(b) for b in reference["turns"][:3]]
    history_tokens = bodies[-1]["usage"]["total_tokens"]  # the last token may be undecoded
    stored = ((history_tokens - 1) // BLOCK) * BLOCK
    checkpoint = wait_for(first, rf"KVMEM_CHECKPOINT tokens=({stored}|{stored + BLOCK}) ")
    stored = int(checkpoint.group(1))
    assert stored >= 4 * BLOCK
    m = metrics(first)
    assert m["kvmem_tier_disk_blocks"] == stored // BLOCK
    assert m["kvmem_tier_ram_blocks"] == 0  # the 1 MiB cap is below one block (2.9 MB)
    assert m["kvmem_tier_degraded"] == 0
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(30)

    # restart: the 4th turn reuses the stored history and answers as if uninterrupted
    second = start_server(disk, server_logs)
    assert f"restored {stored} tokens ({stored // BLOCK} of {stored // BLOCK} blocks)" in (
        second.log()
    )
    fourth = conversation(second, 4, history)[0]
    assert fourth["usage"]["prompt_tokens_details"]["cached_tokens"] >= stored
    assert fourth["usage"]["prompt_tokens_details"]["cached_tokens"] >= history_tokens - BLOCK
    assert text(fourth) == text(reference["turns"][3])

    # 2. needles over the budget: retrieved blocks come through the disk tier
    misses = metrics(second)["kvmem_tier_ram_misses_total"]
    for depth, expected in zip(DEPTHS, reference["needles"], strict=True):
        assert text(chat(second, needle_messages(depth), 12)) == text(expected)
    m = metrics(second)
    assert m["kvmem_tier_ram_misses_total"] > misses and m["kvmem_tier_ram_blocks"] == 0
    assert m["kvmem_stage_in_blocks_total"] > 0
    assert second.stop() == 0, second.log()[-3000:]

    # 3. a torn block file: detected on load, history recomputed from that block
    blocks = sorted((store / "blocks").glob("b*.kvb"))
    assert len(blocks) >= 4
    torn = blocks[2]
    torn.write_bytes(torn.read_bytes()[:1000])
    third = start_server(disk, server_logs)
    assert "kvmem stored block 2 is unusable (block file checksum mismatch)" in third.log()
    assert f"restored {2 * BLOCK} tokens (2 of " in third.log()

    # 4. mid-run: no more writes (read-only directory; as root, a file size limit)
    size = third.log_path.stat().st_size
    limit = max(1 << 20, size + (1 << 19))  # the log stays writable, block files (2.9 MB) not
    os.chmod(store / "blocks", stat.S_IRUSR | stat.S_IXUSR)
    try:
        resource.prlimit(third.proc.pid, resource.RLIMIT_FSIZE, (limit, limit))
        late = chat(third, [{"role": "user", "content": user_turn(3)}])
        assert text(late) == text(reference["late"][0])
        wait_for(third, r"continuing RAM-only \(no block is lost")
        m = metrics(third)
        assert m["kvmem_tier_degraded"] == 1 and m["kvmem_tier_write_failures_total"] >= 1
        # the same request again: reuses all but its last token, still RAM-only
        again = chat(third, [{"role": "user", "content": user_turn(3)}])
        assert text(again) == text(reference["late"][1])
    finally:
        os.chmod(store / "blocks", stat.S_IRWXU)
    assert third.stop() == 0, third.log()[-3000:]

    # 5. another K cache type: the store is refused in one line, the server still answers
    other = start_server((*disk, "-ctk", "q8_0", "-ctv", "q8_0"), server_logs)
    lines = [ln for ln in other.log().splitlines() if "fingerprint mismatch" in ln]
    assert len(lines) == 1
    assert (
        "cache_type_k: stored 'f16', now 'q8_0'; cache_type_v: stored 'f16', now 'q8_0'"
        in (lines[0])
    )
    body = chat(other, history[:2])
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert text(body)
    assert other.stop() == 0, other.log()[-3000:]
