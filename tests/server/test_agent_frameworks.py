"""Real agent frameworks run their tool loops against kvmem-server (issue 29, item 2).

openai-agents (chat completions and Responses), pydantic-ai, smolagents, LangGraph's ReAct
agent over langchain-openai, the anthropic SDK and the openai SDK's Responses, each with the
tool `get_weather(city)` and "What is the weather in Paris?" (runners in agent_loops.py), on
Qwen2.5-Coder-0.5B-Instruct, greedy.

What the server owes every framework is the protocol: each request accepted, each reply's
tool call in the shape the framework parses, with the arguments the model wrote, and the
tool's result accepted back in the next request. Every framework below gets that: it calls
the tool with `city="Paris"` on each of its `MAX_TURNS` model requests.

What the model owes is the final answer, and Qwen2.5-Coder-0.5B does not give it: after the
tool's result it calls the tool again (the same call, each time), so every loop ends at its
framework's own turn limit. smolagents then asks the model once more, without tools, for a
final answer from what the steps found, and that answer is right ("sunny, 21°C"). That is the model, not the protocol: the same requests with the
call and the result in hand, sent by hand, give the same repeated call (test_live_qwen_tool_stop).
Qwen2.5-Coder-1.5B-Instruct (tried by hand, docs/agents.md) answers the result with its
template's example call as text. So each test asserts the exact outcome: the tool called on
every turn and the framework's turn-limit error (smolagents: its final answer); a model that finishes a loop would turn the
test red and the expectation is then updated to the final answer.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server.agent_loops import MAX_TURNS, RUNNERS, LoopOutcome
from tests.server.conftest import LiveServer, start_server

pytestmark = pytest.mark.slow

# the error that ends each framework's loop at its turn limit (None: the loop's end is an answer)
TURN_LIMIT_ERROR = {
    "openai-agents-chat": "MaxTurnsExceeded",
    "openai-agents-responses": "MaxTurnsExceeded",
    "pydantic-ai": "UsageLimitExceeded",
    "smolagents": None,
    "langgraph": "GraphRecursionError",
    "anthropic": "_TurnsExceeded",
    "openai-responses": "_TurnsExceeded",
}


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    pytest.importorskip("kvmem.models")
    logs: Path = tmp_path_factory.mktemp("framework-logs")
    server = start_server(["-m", "qwen-0.5b", "-c", "4096", "-t", "2", "--temp", "0"], logs)
    yield server
    assert server.stop() == 0, server.log()[-3000:]


@pytest.mark.parametrize("framework", sorted(RUNNERS))
def test_a_framework_runs_its_tool_loop_against_the_server(
    qwen: LiveServer, framework: str
) -> None:
    outcome: LoopOutcome = RUNNERS[framework](f"{qwen.base_url}/v1")
    assert outcome.tool_cities == ["Paris"] * MAX_TURNS, (outcome, qwen.log()[-2000:])
    assert outcome.error == TURN_LIMIT_ERROR[framework], outcome
    if outcome.error is None:  # smolagents' answer after its step limit
        assert "21" in (outcome.final or ""), outcome
    else:
        assert outcome.final is None
