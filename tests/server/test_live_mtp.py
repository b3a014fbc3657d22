"""kvmem-server with MTP drafts (--spec-type draft-mtp) on the tiny synthetic qwen35 with one
nextn layer, through the official openai client: the greedy answer is the one of the server
without drafts, the draft counts are in `timings` and /metrics, and /props and the
KVMEM_STARTUP record report the speculative state. A model without an MTP head, and
--spec-kv-dtype without draft-mtp, are refused before the model loads."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvmem.bench.synth_hybrid import QWEN35_TINY
from kvmem.bench.synth_model import WeightType, write_synthetic_model
from tests.engine.hybrid_models import write_echo_head_hybrid

from .conftest import LiveServer, run_server, start_server

pytestmark = pytest.mark.slow

ARGS = ("-c", "2048", "-t", "1", "--kvmem-budget", "128", "--kvmem-gen-reserve", "64")
ARGS += ("--kvmem-block-tokens", "32", "--metrics", "--alias", "tiny", "--kvmem-trace")
PROMPT = "The quick brown fox jumps over the lazy dog. " * 8


def _model(directory: Path, nextn: int) -> Path:
    path = directory / f"qwen35-tiny-nextn{nextn}.gguf"
    shape = dataclasses.replace(QWEN35_TINY, nextn_layers=nextn)  # random weights
    write_synthetic_model(path, shape, WeightType.Q8_0, seed=0, threads=2)
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """0: no MTP head; 1: the echo head (tests/engine/hybrid_models.py), whose drafts the
    trunk accepts often but not always."""
    d = tmp_path_factory.mktemp("mtp-models")
    return {0: _model(d, 0), 1: write_echo_head_hybrid(d)}


@pytest.fixture(scope="module")
def servers(models: dict[int, Path], server_logs: Path) -> Iterator[dict[str, LiveServer]]:
    m = str(models[1])
    mtp = start_server(["-m", m, *ARGS, "--spec-type", "draft-mtp", "--no-spec-gate"], server_logs)
    plain = start_server(["-m", m, *ARGS], server_logs)
    yield {"mtp": mtp, "plain": plain}
    for server in (mtp, plain):
        assert server.stop() == 0, server.log()[-3000:]


def test_mtp_answer_equals_plain_and_reports_drafts(servers: dict[str, LiveServer]) -> None:
    answers = {}
    for name, server in servers.items():
        out = server.client().completions.create(
            model="tiny", prompt=PROMPT, max_tokens=80, temperature=0
        )
        answers[name] = out
    text = answers["mtp"].choices[0].text
    assert text == answers["plain"].choices[0].text and len(text) > 0
    assert answers["mtp"].usage.completion_tokens == 80
    timings = answers["mtp"].model_extra["timings"]
    assert 0 < timings["draft_n_accepted"] < timings["draft_n"]
    assert "draft_n" not in answers["plain"].model_extra["timings"]
    mtp = servers["mtp"]
    metrics = mtp.http().get("/metrics").text
    drafts = re.search(r"^kvmem_draft_tokens_total (\S+)$", metrics, re.M)
    assert drafts and float(drafts.group(1)) >= timings["draft_n"]
    want = {"type": "draft-mtp", "n_max": 3, "kv_type": "f16"}
    assert mtp.http().get("/props").json()["speculative"] == want
    ready = [ln for ln in mtp.log().splitlines() if ln.startswith("KVMEM_STARTUP ready=")]
    record = json.loads(ready[0].split("=", 1)[1])
    assert record["speculative"] == want and record["mtp"] is True


def test_draft_mtp_without_a_head_fails_before_loading(models: dict[int, Path]) -> None:
    run = run_server(["-m", str(models[0]), "--spec-type", "draft-mtp"])
    assert run.returncode == 2, run.stderr
    assert "--spec-type: draft-mtp needs a model with an MTP (nextn) head" in run.stderr
    assert "llama_model_load" not in run.stderr  # no weights were loaded
    run = run_server(["-m", str(models[1]), "--spec-kv-dtype", "q8_0"])
    assert run.returncode == 2, run.stderr
    assert "--spec-kv-dtype: applies to --spec-type draft-mtp only" in run.stderr
