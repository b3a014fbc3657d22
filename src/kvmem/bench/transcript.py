"""A deterministic multi-turn agent transcript for the fidelity benchmark.

Each turn: the agent calls a few tools (logs, JSON query results, source files), then
the user asks about a fact from an *earlier* turn's tool result, and the assistant's
answer restates it. The answers are the teacher-forced continuations: predicting their
fact tokens needs the far history, which is what a bounded window may lose.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from kvmem.bench import content
from kvmem.bench.conversation import Message, Role

SYSTEM_PROMPT = (
    "You are a coding agent. You can call the tools read_file, run_command and query_db; "
    "their results come back as tool messages. Answer questions about earlier results precisely."
)


@dataclass(frozen=True, slots=True)
class Fact:
    question: str
    answer: str


@dataclass(slots=True)
class ToolResult:
    call: str
    text: str
    facts: list[Fact] = field(default_factory=list)


@dataclass(slots=True)
class Turn:
    """The messages added by one turn; the last two are the user question and the answer."""

    messages: list[Message]
    question: str
    answer: str
    fact_turn: int  # the turn whose tool result the question is about


def _orders_result(rng: random.Random, n: int) -> ToolResult:
    rows, facts = [], []
    for _ in range(n):
        order = rng.randrange(100000, 999999)
        who, city = rng.choice(content.FIRST_NAMES), rng.choice(content.CITIES)
        status = rng.choice(("paid", "shipped", "pending", "refunded"))
        total = f"{rng.randrange(3, 500)}.{rng.randrange(100):02d}"
        rows.append(
            f'{{"id": {order}, "customer": "{who}", "city": "{city}", '
            f'"total_eur": {total}, "status": "{status}"}}'
        )
        facts.append(
            Fact(
                f"Who placed order {order}, and what is its status?",
                f"Order {order} was placed by {who} from {city}; its status is {status} "
                f"and the total is {total} EUR.",
            )
        )
    call = f'<tool_call>{{"name": "query_db", "arguments": {{"sql": "SELECT * FROM orders LIMIT {n}"}}}}</tool_call>'
    return ToolResult(call, "[\n" + ",\n".join(rows) + "\n]", facts)


def _log_result(rng: random.Random, n: int) -> ToolResult:
    service = f"{rng.choice(content.SERVICES)}-{rng.randrange(1, 5)}"
    lines = content.log_lines(rng, n, rng.randrange(0, 80000))
    error_at = rng.randrange(len(lines))
    request = f"{rng.randrange(16**6):06x}"
    stamp = lines[error_at].split(" ", 1)[0]
    lines[error_at] = (
        f"{stamp} ERROR {service} request_id={request} path=/v1/export "
        f'status=500 error="disk quota exceeded on volume vol-{rng.randrange(10, 99)}"'
    )
    volume = lines[error_at].rsplit("vol-", 1)[1].rstrip('"')
    facts = [
        Fact(
            f"Which request failed in the {service} log, and why?",
            f"Request {request} to /v1/export failed at {stamp} with status 500: "
            f"disk quota exceeded on volume vol-{volume}.",
        )
    ]
    call = f'<tool_call>{{"name": "run_command", "arguments": {{"cmd": "tail -n {n} logs/{service}.log"}}}}</tool_call>'
    return ToolResult(call, "\n".join(lines), facts)


def _source_result(rng: random.Random, n: int) -> ToolResult:
    parts, facts = ['"""Helpers for the inventory service."""', ""], []
    module = f"{rng.choice(content.NOUNS)}_service"
    for i in range(n):
        name = f"{rng.choice(('compute', 'load', 'merge', 'check', 'update'))}_{rng.choice(content.NOUNS)}_{i}"
        limit, factor = rng.randrange(10, 500), rng.randrange(2, 50)
        parts += [
            f"def {name}(value: int, limit: int = {limit}) -> int:",
            f"    result = value * {factor}",
            "    return min(result, limit)",
            "",
        ]
        facts.append(
            Fact(
                f"In {module}.py, what does {name} do?",
                f"{name} multiplies the value by {factor} and caps the result at "
                f"{limit} by default.",
            )
        )
    call = f'<tool_call>{{"name": "read_file", "arguments": {{"path": "src/{module}.py"}}}}</tool_call>'
    return ToolResult(call, "\n".join(parts), facts)


def _tool_result(rng: random.Random, index: int, size: int) -> ToolResult:
    kind = index % 3
    if kind == 0:
        return _orders_result(rng, max(2, size // 2))
    if kind == 1:
        return _log_result(rng, size)
    return _source_result(rng, max(2, size // 3))


def build_transcript(
    seed: int, n_turns: int, tools_per_turn: int = 3, tool_size: int = 12, min_gap: int = 2
) -> tuple[list[Message], list[Turn]]:
    """The system and task messages, then `n_turns` turns.

    The question of turn t asks about a tool result of turn t - gap (gap >= min_gap when
    t allows it, else the earliest turn), chosen by the seed.
    """
    rng = random.Random(f"fidelity/{seed}")
    head = [
        Message(Role.SYSTEM, SYSTEM_PROMPT),
        Message(
            Role.USER,
            "The nightly export job keeps failing. Investigate the logs, the "
            "orders database and the service code, and answer my questions.",
        ),
    ]
    turns: list[Turn] = []
    facts_by_turn: list[list[Fact]] = []
    counter = 0
    for t in range(n_turns):
        messages: list[Message] = []
        turn_facts: list[Fact] = []
        for _ in range(tools_per_turn):
            result = _tool_result(rng, counter, tool_size)
            counter += 1
            messages += [Message(Role.ASSISTANT, result.call), Message(Role.TOOL, result.text)]
            turn_facts += result.facts
        facts_by_turn.append(turn_facts)
        source = rng.randrange(0, t - min_gap + 1) if t >= min_gap else 0
        fact = rng.choice(facts_by_turn[source])
        messages.append(Message(Role.USER, fact.question))
        turns.append(
            Turn(messages=messages, question=fact.question, answer=fact.answer, fact_turn=source)
        )
        # the answer becomes part of the history before the next turn
    return head, turns


def history_through(head: list[Message], turns: list[Turn], t: int) -> list[Message]:
    """Messages up to and including turn t's question (earlier answers included)."""
    out = list(head)
    for i in range(t + 1):
        out += turns[i].messages
        if i < t:
            out.append(Message(Role.ASSISTANT, turns[i].answer))
    return out
