"""Agent-harness shapes on a real kvmem-server (SmolLM2): Claude Code through /v1/messages,
OpenCode through chat completions, Codex CLI through /v1/responses, with request bodies
made here (tests/unit/harness_bodies.py; two tools each, to keep the prompts short). Over ten turns that pass the budget, the pinned
tier (system prompt, tools, the CLAUDE.md/AGENTS.md reminder) is the same blocks in every
reselection the trace shows, and never dropped; a reminder too large for the budget gets
a 413 naming it, in each API's envelope."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.conftest import LiveServer, start_server
from tests.unit.harness_bodies import (
    CLAUDE_SYSTEM,
    CODEX_SYSTEM,
    claude_md,
    codex,
    opencode,
)

pytestmark = pytest.mark.slow

BUDGET = 768
ARGS = ("-c", "8192", "--kvmem-budget", str(BUDGET), "--kvmem-gen-reserve", "256", "-t", "2")
ARGS += ("--kvmem-trace",)
RULE = "Run the tests with make check."
HUGE = " ".join(f"Rule {i}: keep line {i} short." for i in range(250))  # ~2500 tokens
RESELECT = re.compile(r"^KVMEM_RESELECT .*$", re.M)


@pytest.fixture(scope="module")
def server(server_logs: Path) -> Iterator[LiveServer]:
    live = start_server(ARGS, server_logs)
    yield live
    assert live.stop() == 0, live.log()[-3000:]


def filler(i: int) -> str:
    return f"Output of step {i}: " + " ".join(f"file{j}.py ok" for j in range(20))


def post(server: LiveServer, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(server.base_url + path, json=body, timeout=600)


def anthropic_body(rule: str, turns: int) -> dict[str, Any]:
    tools = [{"name": n, "description": n, "input_schema": {"type": "object"}}
             for n in ("Bash", "Read")]  # fmt: skip
    first = [{"type": "text", "text": claude_md(rule)}, {"type": "text", "text": "Fix the bug."}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": first}]
    for i in range(turns):
        messages += [{"role": "assistant", "content": f"Step {i}."},
                     {"role": "user", "content": filler(i)}]  # fmt: skip
    return {"model": "smol", "max_tokens": 2, "system": CLAUDE_SYSTEM, "tools": tools,
            "messages": messages}  # fmt: skip


def chat_body(rule: str, turns: int) -> dict[str, Any]:
    body = opencode(rule, "Fix the bug.")
    body["tools"] = body["tools"][:2]  # bash, read: the system prompt's marker recognises it
    for i in range(turns):
        body["messages"] += [{"role": "assistant", "content": f"Step {i}."},
                             {"role": "user", "content": filler(i)}]  # fmt: skip
    return {**body, "max_tokens": 2}


def responses_body(rule: str, turns: int) -> dict[str, Any]:
    chat = codex(rule, "Fix the bug.")
    items: list[dict[str, Any]] = [{"role": m["role"], "content": m["content"]}
                                   for m in chat["messages"][1:]]  # fmt: skip
    for i in range(turns):
        items += [{"role": "assistant", "content": f"Step {i}."},
                  {"role": "user", "content": filler(i)}]  # fmt: skip
    tools = [{"type": "function", "name": t["function"]["name"], "parameters": t["function"]["parameters"]}
             for t in chat["tools"][:2]]  # fmt: skip
    return {"instructions": CODEX_SYSTEM, "input": items, "tools": tools,
            "max_output_tokens": 2, "store": False}  # fmt: skip


SHAPES: dict[str, tuple[str, Callable[[str, int], dict[str, Any]]]] = {
    "claude-code": ("/v1/messages", anthropic_body),
    "opencode": ("/v1/chat/completions", chat_body),
    "codex": ("/v1/responses", responses_body),
}


def reselections(log: str) -> list[dict[str, str]]:
    return [dict(kv.split("=", 1) for kv in m.group(0).split()[1:]) for m in RESELECT.finditer(log)]


@pytest.mark.parametrize("harness", list(SHAPES))
def test_pinned_control_text_stays_across_ten_turns_over_the_budget(
    server: LiveServer, harness: str
) -> None:
    path, make = SHAPES[harness]
    start = len(server.log())
    for turns in range(10):
        r = post(server, path, make(RULE, turns))
        assert r.status_code == 200, r.text
    log = server.log()[start:]
    records = [r for r in reselections(log) if int(r["candidates"]) * 128 > BUDGET]
    assert len(records) >= 3, log[-3000:]  # the history passed the budget
    pinned = {r["pinned"] for r in records}
    assert len(pinned) == 1 and pinned != {"-"}, pinned  # the same blocks every time
    assert "KVMEM_TIER_DROP tier=pinned" not in log


@pytest.mark.parametrize("harness", list(SHAPES))
def test_an_oversized_reminder_is_a_413_naming_it(server: LiveServer, harness: str) -> None:
    path, make = SHAPES[harness]
    r = post(server, path, make(HUGE, 0))
    assert r.status_code == 413, r.text
    body = r.json()
    error = body["error"]
    name = "CLAUDE.md reminder" if harness == "claude-code" else "AGENTS.md reminder"
    assert f"the {harness} request's pinned control text needs" in error["message"]
    assert re.search(rf"{name}: \d+ tokens", error["message"]), error["message"]
    assert f"KVMem budget is {BUDGET} tokens" in error["message"]
    if harness == "claude-code":
        assert body["type"] == "error" and error["type"] == "request_too_large"
    else:
        assert error["code"] == "pinned_context_too_large"
