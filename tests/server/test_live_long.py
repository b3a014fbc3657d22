"""A conversation that outgrows the GPU budget (`-c 8192 --kvmem-budget 1024`) keeps
answering, and /metrics shows KV staged out to the host and back in."""

from __future__ import annotations

import random
import re

import httpx
import pytest

from tests.server.conftest import LiveServer

pytestmark = pytest.mark.slow

WORDS = [
    "river",
    "stone",
    "lantern",
    "harbor",
    "copper",
    "meadow",
    "signal",
    "archive",
    "orbit",
    "timber",
    "quartz",
    "valley",
    "ember",
    "canyon",
    "beacon",
    "glacier",
    "willow",
    "compass",
    "marble",
    "thunder",
    "saffron",
    "falcon",
]


def filler(seed: int, n_sentences: int) -> str:
    rng = random.Random(seed)
    sentences = []
    for _ in range(n_sentences):
        words = [rng.choice(WORDS) for _ in range(rng.randint(6, 10))]
        sentences.append(" ".join(words).capitalize() + ".")
    return " ".join(sentences)


def metrics(server: LiveServer) -> dict[str, float]:
    text = httpx.get(server.base_url + "/metrics", timeout=30).text
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(\S+) (\S+)$", text, re.M)}


def test_long_conversation_over_the_budget_keeps_answering(main_server: LiveServer) -> None:
    client = main_server.client()
    before = metrics(main_server)
    memory: list[dict[str, int]] = []
    messages = [{"role": "user", "content": "Remember this: the passkey is 4821. " + filler(0, 30)}]
    prompt_tokens = []
    for turn in range(1, 5):
        response = client.chat.completions.create(
            model="smol", messages=messages, max_tokens=6, temperature=0
        )
        assert response.choices[0].finish_reason in ("stop", "length")
        assert response.usage is not None
        memory.append(_memory(response))
        prompt_tokens.append(response.usage.prompt_tokens)
        messages.append({"role": "assistant", "content": response.choices[0].message.content or ""})
        messages.append({"role": "user", "content": f"Log part {turn}: " + filler(turn, 30)})
    messages.append({"role": "user", "content": "What is the passkey?"})
    final = client.chat.completions.create(
        model="smol", messages=messages, max_tokens=8, temperature=0
    )
    assert final.choices[0].message.content is not None
    assert final.usage is not None
    memory.append(_memory(final))
    assert final.usage.prompt_tokens > 1024 + 512  # the history is larger than budget + reserve
    assert prompt_tokens == sorted(prompt_tokens)
    after = metrics(main_server)
    assert after["kvmem_harvested_bytes_total"] > 0
    assert after["kvmem_stage_in_bytes_total"] > 0
    assert after["kvmem_host_blocks"] > 0
    assert after["kvmem_gpu_cells_max"] == 1024 + 512
    # the per-turn `kvmem` objects account for the same blocks as the server's counters
    retrieved = sum(m["retrieved_blocks"] for m in memory)
    assert retrieved == after["kvmem_stage_in_blocks_total"] - before["kvmem_stage_in_blocks_total"]
    assert retrieved > 0
    assert all(m["retrieved_tokens"] == 128 * m["retrieved_blocks"] for m in memory)
    assert all(
        m["reprocessed_tokens"] == m["prefill_tokens"] + m["replayed_tokens"] for m in memory
    )


def _memory(response: object) -> dict[str, int]:
    """The response's `kvmem` object, checked against its usage."""
    body = response.model_dump()  # type: ignore[attr-defined]
    kv = body["kvmem"]
    usage = body["usage"]
    assert kv["cached_tokens"] == usage["prompt_tokens_details"]["cached_tokens"]
    assert (
        kv["prefill_tokens"]
        == usage["prompt_tokens"] - usage["prompt_tokens_details"]["cached_tokens"]
    )
    return kv
