"""A long OpenAI-format tool conversation over the budget keeps the system prompt and the
tool definitions on the GPU: the trace's RESELECT records hold the control tier, and
/props shows the last plan's blocks by tier."""

from __future__ import annotations

import json
import re

import pytest

from tests.server.conftest import MAIN_ARGS, LiveServer, start_server
from tests.server.test_live_long import filler

pytestmark = pytest.mark.slow

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "run_shell",
            "description": "Run a shell command in the repository and return its output",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
]
SYSTEM = "You are a careful coding agent. " + filler(99, 12)


def _tool_round(i: int) -> list[dict]:
    call = {
        "id": f"call_{i}",
        "type": "function",
        "function": {"name": "run_shell", "arguments": json.dumps({"command": f"cat log{i}.txt"})},
    }
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"call_{i}", "content": filler(i, 25)},
    ]


@pytest.fixture(scope="module")
def agent_server(server_logs):
    server = start_server([*MAIN_ARGS, "--kvmem-control-tokens", "512"], server_logs)
    yield server
    assert server.stop() == 0, server.log()[-3000:]


def test_tool_loop_keeps_control_text_on_the_gpu(agent_server: LiveServer) -> None:
    client = agent_server.client()
    messages: list[dict] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Find why the build fails; read the logs."},
    ]
    for i in range(6):
        messages += _tool_round(i)
        response = client.chat.completions.create(
            model="smol", messages=messages, tools=TOOLS, max_tokens=8, temperature=0
        )
        assert response.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert response.usage is not None and response.usage.prompt_tokens > 1024 + 512
    props = agent_server.http().get("/props").json()["kvmem"]
    window = props["window"]
    assert props["query_policy"] == "agent" and props["tier_tokens"]["control"] == 512
    # the control text (system prompt + tool definitions) is blocks 0..k: the sink and the
    # control tier hold every one of them, next to the task and the trajectory
    control = window["sink"] + window["control"]
    assert control == list(range(len(control))) and len(control) >= 2
    assert window["trajectory"]  # the task's block may be the control text's last one
    log = agent_server.log()
    records = [ln for ln in log.splitlines() if ln.startswith("KVMEM_RESELECT")]
    assert len(records) >= 6
    last = dict(re.findall(r"(\w+)=(\S+)", records[-1]))
    assert last["sink"] == "0" and last["control"] == ",".join(map(str, window["control"]))
    assert last["trajectory"] == ",".join(map(str, window["trajectory"]))
    # 8 blocks of budget: sink, control (512 tokens), recent and trajectory leave no slot
    # for retrieval, so the trajectory keeps its newest blocks and the rest is named
    assert "KVMEM_TIER_DROP tier=trajectory" in log
    assert "KVMEM_TIER_DROP tier=control" not in log
