"""SIGTERM (5 times each), SIGINT and SIGHUP during a long prefill or a long decode: exit 0
within 5 s (issue 28), every client gets an ending: the stream a terminal event and
[DONE], the queued request a 503 `shutting_down`. Each phase's rounds share one
`--kvmem-disk-dir`: every start reloads what the previous signal left with no block
unusable, and at the end the stores reload and the greedy answer equals a fresh server's.

The prefill is made long with a small model and a small batch (`-b 8 -ub 8`, one thread), not with a
huge prompt: it then takes many seconds, and the signal arrives while llama.cpp is busy. The
decode is made long with `ignore_eos` and a large `max_tokens`; the signal comes once tokens flow.
"""

from __future__ import annotations

import json
import re
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.server.hostile_helpers import fresh_answer, normal_answer, start_limited

pytestmark = pytest.mark.slow

EXIT_WITHIN_S = 5.0
# (phase, signal): 7 rounds during prefill, 6 during decode
SIGNALS = {
    "prefill": ("SIGTERM",) * 5 + ("SIGINT", "SIGHUP"),
    "decode": ("SIGTERM",) * 5 + ("SIGINT",),
}
ROUNDS = [(phase, i, sig) for phase, sigs in SIGNALS.items() for i, sig in enumerate(sigs)]
ARGS = ("-c", "8192", "-b", "8", "-ub", "8", "-t", "1", "--no-ui", "--kvmem-block-tokens", "32")
WORDS = "the quick brown fox jumps over the lazy dog near the river bank today "
LONG = WORDS * 300  # about 4,000 tokens
RESTORED = re.compile(r"restored (\d+) tokens \((\d+) of (\d+) blocks\)")
BODIES = {
    "prefill": {"stream": True, "max_tokens": 8},
    "decode": {
        "messages": [{"role": "user", "content": "Tell a long story."}],
        "stream": True,
        "max_tokens": 4000,
        "ignore_eos": True,
    },
}


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One --kvmem-disk-dir per phase, shared by its rounds."""
    return {phase: tmp_path_factory.mktemp(f"store-{phase}") for phase in SIGNALS}


def _body(phase: str, round_: int) -> dict[str, object]:
    if phase == "decode":
        return BODIES[phase]
    # another start each round: the stored history does not shorten the prefill
    return {**BODIES[phase], "messages": [{"role": "user", "content": f"Round {round_}. {LONG}"}]}


def _assert_reloaded_whole(log: str) -> int:
    """The store's line on start: nothing stored, or every stored block restored."""
    assert "unusable" not in log and "another version" not in log and "refused" not in log, log
    found = RESTORED.search(log)
    if found is None:
        assert "no stored session" in log, log[-3000:]
        return 0
    assert found.group(2) == found.group(3), found.group(0)
    return int(found.group(1))


def _stream_until_end(
    base_url: str, body: dict[str, object], started: threading.Event, out: dict[str, object]
) -> None:
    try:
        with (
            httpx.Client(base_url=base_url, timeout=120) as http,
            http.stream("POST", "/v1/chat/completions", json=body) as response,
        ):
            out["status"] = response.status_code
            lines = []
            for line in response.iter_lines():
                if line:
                    lines.append(line)
                # prefill: the headers come once the job left the queue; decode: tokens flow
                if body is not BODIES["decode"] or len(lines) >= 4:
                    started.set()
        out["lines"] = lines
    except httpx.HTTPError as exc:
        out["error"] = repr(exc)
    finally:
        started.set()


def _queued(base_url: str, out: dict[str, object]) -> None:
    try:
        r = httpx.post(
            base_url + "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
            timeout=120,
        )
        out["status"], out["body"] = r.status_code, r.json()
    except httpx.HTTPError as exc:
        out["error"] = repr(exc)


@pytest.mark.parametrize(
    ("phase", "round_", "name"), ROUNDS, ids=[f"{p}-{i}-{s}" for p, i, s in ROUNDS]
)
def test_signal_during_a_long_generation_exits_0_within_5_s_and_ends_every_client(
    phase: str, round_: int, name: str, tmp_path: Path, stores: dict[str, Path]
) -> None:
    sig = getattr(signal, name)
    server = start_limited((*ARGS, "--kvmem-disk-dir", str(stores[phase])), tmp_path)
    try:
        _assert_reloaded_whole(server.log())
        started = threading.Event()
        streamed: dict[str, object] = {}
        queued: dict[str, object] = {}
        body = _body(phase, round_)
        t1 = threading.Thread(
            target=_stream_until_end, args=(server.base_url, body, started, streamed)
        )
        t1.start()
        assert started.wait(60), "the stream never started"
        assert streamed.get("status") == 200, streamed
        t2 = threading.Thread(target=_queued, args=(server.base_url, queued))
        t2.start()
        time.sleep(0.5)  # the second request waits in the queue; the prefill runs
        sent = time.monotonic()
        server.proc.send_signal(sig)
        code = server.proc.wait(EXIT_WITHIN_S + 20)
        took = time.monotonic() - sent
        t1.join(30)
        t2.join(30)
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()
    log = server.log()
    assert code == 0, log[-3000:]
    assert took < EXIT_WITHIN_S, f"exit took {took:.1f} s"
    assert "Traceback" not in log, log[-3000:]
    lines = streamed.get("lines")
    assert isinstance(lines, list), streamed
    assert lines[-1] == "data: [DONE]"
    last = json.loads(lines[-2][len("data: ") :])
    assert last["error"]["code"] == "shutting_down", last  # a terminal error event
    stopped = {
        "prefill": "the prompt's processing was cancelled",
        "decode": "the generation was stopped by the shutdown",
    }
    assert stopped[phase] in log
    assert queued.get("status") == 503, queued
    assert queued["body"]["error"]["code"] == "shutting_down"  # type: ignore[index]


def test_the_stores_reload_after_the_signals_and_answer_as_a_fresh_server(
    tmp_path: Path, stores: dict[str, Path]
) -> None:
    expected = fresh_answer(ARGS, tmp_path)
    for phase, store in stores.items():
        server = start_limited((*ARGS, "--kvmem-disk-dir", str(store)), tmp_path)
        try:
            restored = _assert_reloaded_whole(server.log())
            assert restored > 0 or phase == "prefill", restored  # decode: the story's blocks
            assert normal_answer(server) == expected
        finally:
            assert server.stop() == 0, server.log()[-3000:]
