"""kvmem-server with prompt-lookup drafts (--spec-type ngram-simple): the greedy answer is the
one of the server without drafts, the draft counts are in `timings` and /metrics, and /props
and the KVMEM_STARTUP record report the speculative state."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import MAIN_ARGS, LiveServer, run_server, start_server

pytestmark = pytest.mark.slow

CODE = (
    "def area(width, height):\n    return width * height\n\n"
    "def perimeter(width, height):\n    return 2 * (width + height)\n"
)
MESSAGES = [
    {"role": "user", "content": f"Here is shapes.py:\n{CODE}\nWrite shapes.py again, unchanged."}
]


def _one_thread(args) -> list[str]:
    """MAIN_ARGS with -t 1: batched verification and single-token decodes then compute the
    same logits (with -t 2 llama.cpp's CPU flash attention splits the KV of a single query
    row over the threads and rounds differently; docs/server.md, speculative decoding)."""
    out = list(args)
    out[out.index("-t") + 1] = "1"
    return out


@pytest.fixture(scope="module")
def spec_server(server_logs: Path) -> Iterator[LiveServer]:
    server = start_server(
        [*_one_thread(MAIN_ARGS), "--spec-type", "ngram-simple", "--no-spec-gate"], server_logs
    )
    yield server
    assert server.stop() == 0, server.log()[-3000:]


@pytest.fixture(scope="module")
def plain_server(server_logs: Path) -> Iterator[LiveServer]:
    server = start_server(_one_thread(MAIN_ARGS), server_logs)
    yield server
    assert server.stop() == 0, server.log()[-3000:]


def _chat(server: LiveServer) -> dict:
    body = {"model": "smol", "messages": MESSAGES, "temperature": 0, "max_tokens": 60}
    resp = server.http().post("/v1/chat/completions", json=body, timeout=600)
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_drafted_answer_equals_plain_and_reports_drafts(
    spec_server: LiveServer, plain_server: LiveServer
) -> None:
    drafted, plain = _chat(spec_server), _chat(plain_server)
    text = drafted["choices"][0]["message"]["content"]
    assert text == plain["choices"][0]["message"]["content"]
    assert "return width * height" in text
    t = drafted["timings"]
    assert 0 < t["draft_n_accepted"] <= t["draft_n"]
    assert "draft_n" not in plain["timings"]
    metrics = spec_server.http().get("/metrics").text
    drafts = re.search(r"^kvmem_draft_tokens_total (\S+)$", metrics, re.M)
    accepted = re.search(r"^kvmem_draft_accepted_tokens_total (\S+)$", metrics, re.M)
    assert drafts and accepted
    assert float(drafts.group(1)) >= t["draft_n"] and float(accepted.group(1)) > 0
    raw = spec_server.http().post(
        "/completion",
        json={
            "prompt": "def area(width, height):\n    return width * height\n\ndef area(",
            "n_predict": 16,
            "temperature": 0,
        },
        timeout=600,
    )
    assert raw.status_code == 200, raw.text
    assert raw.json()["timings"]["draft_n"] > 0
    props = spec_server.http().get("/props").json()
    assert props["speculative"] == {"type": "ngram-simple", "n_max": 3, "kv_type": None}
    ready = [ln for ln in spec_server.log().splitlines() if ln.startswith("KVMEM_STARTUP ready=")]
    record = json.loads(ready[0].split("=", 1)[1])
    assert record["speculative"] == {"type": "ngram-simple", "n_max": 3, "kv_type": None}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--spec-type", "draft-mtp"],
            "--spec-type: draft-mtp needs a model with an MTP (nextn) head",
        ),
        (["--spec-type", "ngram"], "--spec-type: unknown type 'ngram'"),
        (["--spec-draft-n-min", "2"], "draft models are not supported"),
    ],
)
def test_bad_spec_flags_fail_before_the_model_loads(args: list[str], message: str) -> None:
    run = run_server(args)
    assert run.returncode == 2, run.stderr
    assert message in run.stderr
