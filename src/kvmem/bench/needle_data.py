"""Needle-in-a-haystack cases: pass keys hidden at a depth of a long conversation.

Three layouts: `document` (one user message holds a long document, the assistant
acknowledges it, then a separate user turn asks the question), `tools` (an agent
conversation of tool calls and tool results: logs, JSON and source files; the needle is
one line of a tool result; then a user question) and `agent` (the agent loop itself: the
last user message is the task at the start, the needle is a line of a tool result, and
the final message is a tool result that asks for the key; see `needle_agent`), and `raw`
(the document and the question as one completion prompt, no chat template: its parts are
the case's messages' contents, concatenated by `compact_prompts.raw_render`). Kinds: `passkey` (one key) and `multikey` (four keys for
named vaults, the question asks for one of them). Cases are a pure function of their
spec, so every method sees the same tokens.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from kvmem.bench import content
from kvmem.bench.conversation import Message, Role
from kvmem.errors import ConfigError

SYSTEM_PROMPT = "You are a helpful assistant."
AGENT_SYSTEM_PROMPT = (
    "You are a coding agent. You can call the tools read_file, run_command and query_db; "
    "their results come back as tool messages."
)
ANSWER_PREFIX = "The pass key is"
_DOCUMENT_INTRO = "Read this document carefully.\n\n"
_TOOLS_TASK = (
    "The nightly job failed. Look through the logs, data and code, "
    "and keep track of anything important."
)
_ACK = "I have read the document."
RAW_QUESTION = "\n\nQuestion: {question}\nAnswer:"
_TOOLS_ACK = "I have gone through the tool results."
_MARKUP_TOKENS = 6  # chat markup per message: <|im_start|>role\n ... <|im_end|>\n
_N_DISTRACTORS = 3


class NeedleKind(Enum):
    PASSKEY = "passkey"
    MULTIKEY = "multikey"


class Layout(Enum):
    DOCUMENT = "document"
    TOOLS = "tools"
    AGENT = "agent"
    RAW = "raw"  # a completion prompt: the document, then the question; no chat template


@dataclass(frozen=True, slots=True)
class NeedleSpec:
    kind: NeedleKind
    layout: Layout
    length: int  # target prompt tokens
    depth: float  # 0.0 = start of the haystack, 1.0 = its end
    seed: int


@dataclass(slots=True)
class NeedleCase:
    spec: NeedleSpec
    messages: list[Message]
    expected: str  # the digits the answer must contain
    answer_prefix: str
    needle: str = ""  # the sentence that holds the expected key (the oracle forces its tokens)
    tools: list[dict[str, Any]] | None = None  # tool definitions the prompt is rendered with


def needle_sentence(key: str, vault: str | None) -> str:
    if vault is None:
        return f"The pass key is {key}. Remember it. {key} is the pass key."
    return f"The pass key for the {vault} vault is {key}. Remember it. {key} is the pass key of the {vault} vault."


def build_case(spec: NeedleSpec, count_tokens: Callable[[str], int]) -> NeedleCase:
    """The case for `spec`; `count_tokens` measures text so the prompt reaches `spec.length`."""
    if not 0.0 <= spec.depth <= 1.0:
        raise ConfigError("--depths", f"a depth must be in [0, 1], got {spec.depth}")
    # The haystack depends on (layout, length, seed) only, so depths share their prefix.
    hay_rng = random.Random(f"haystack/{spec.layout.value}/{spec.length}/{spec.seed}")
    key_rng = random.Random(f"keys/{spec.kind.value}/{spec.length}/{spec.seed}/{spec.depth:.4f}")
    if spec.kind is NeedleKind.PASSKEY:
        target_vault, others = None, []
    else:
        vaults = key_rng.sample(content.VAULTS, _N_DISTRACTORS + 1)
        target_vault, others = vaults[0], vaults[1:]
    key = content.passkey(key_rng)
    needle = needle_sentence(key, target_vault)
    needles = [(spec.depth, needle)]
    for vault in others:
        needles.append((key_rng.random(), needle_sentence(content.passkey(key_rng), vault)))
    if spec.layout is Layout.AGENT:
        from kvmem.bench.needle_agent import agent_loop_case

        loop = agent_loop_case(spec.length, hay_rng, needles, target_vault, count_tokens)
        return NeedleCase(
            spec=spec,
            messages=loop.messages,
            expected=key,
            answer_prefix=loop.answer_prefix,
            needle=needle,
            tools=loop.tools,
        )
    if target_vault is None:
        question = "What is the pass key? Answer with the number only."
        prefix = ANSWER_PREFIX
    else:
        question = (
            f"What is the pass key for the {target_vault} vault? Answer with the number only."
        )
        prefix = f"The pass key for the {target_vault} vault is"
    if spec.layout is Layout.RAW:
        prefix = " " + prefix  # after "Answer:"
    fixed = [
        SYSTEM_PROMPT if spec.layout is not Layout.TOOLS else AGENT_SYSTEM_PROMPT,
        question,
        prefix,
        _DOCUMENT_INTRO if spec.layout is not Layout.TOOLS else _TOOLS_TASK,
        _ACK if spec.layout is not Layout.TOOLS else _TOOLS_ACK,
    ]
    overhead = sum(count_tokens(text) for text in fixed) + 5 * _MARKUP_TOKENS
    budget = max(64, spec.length - overhead)
    if spec.layout is Layout.RAW:
        document = _document_messages(hay_rng, budget, needles, count_tokens, question)[1]
        messages = [document, Message(Role.USER, RAW_QUESTION.format(question=question))]
    elif spec.layout is Layout.DOCUMENT:
        messages = _document_messages(hay_rng, budget, needles, count_tokens, question)
    else:
        messages = _tool_messages(hay_rng, budget, needles, count_tokens, question)
    return NeedleCase(
        spec=spec, messages=messages, expected=key, answer_prefix=prefix, needle=needle
    )


def _insert(units: list[str], needles: list[tuple[float, str]]) -> list[str]:
    """Insert each needle before the unit at round(depth * len(units)); stable for ties."""
    out = list(units)
    placed = sorted(
        ((round(d * len(units)), i, text) for i, (d, text) in enumerate(needles)), reverse=True
    )
    for index, _, text in placed:
        out.insert(index, text)
    return out


def _document_messages(
    rng: random.Random,
    budget: int,
    needles: list[tuple[float, str]],
    count_tokens: Callable[[str], int],
    question: str,
) -> list[Message]:
    sentences: list[str] = []
    used = sum(count_tokens(" " + text) for _, text in needles)
    while used < budget:
        sentence = content.filler_sentence(rng)
        sentences.append(sentence)
        used += count_tokens(" " + sentence)
    document = " ".join(_insert(sentences, needles))
    return [
        Message(Role.SYSTEM, SYSTEM_PROMPT),
        Message(Role.USER, _DOCUMENT_INTRO + document),
        Message(Role.ASSISTANT, _ACK),
        Message(Role.USER, question),
    ]


def tool_rounds(
    rng: random.Random,
    budget: int,
    needles: list[tuple[float, str]],
    count_tokens: Callable[[str], int],
    render_call: Callable[[str, str, str], str],
    round_markup: int = 2 * _MARKUP_TOKENS,
    trim: bool = False,
) -> list[tuple[str, str, str, list[str]]]:
    """Rounds of (tool name, argument name, argument, result lines) filling `budget` tokens, with the
    needles inserted as lines of the results at their depths. `render_call(name, key,
    input)` is the call's text as the prompt shows it (for counting). With `trim`, lines
    are dropped from the end of the last result while the rounds still fill the budget
    (results are up to ~1K tokens, so without it a prompt can overshoot by that much)."""
    actions: list[tuple[str, str, str]] = []
    results: list[list[str]] = []
    used = sum(count_tokens(text + "\n") for _, text in needles)
    kind = 0
    while used < budget:
        kind += 1
        action = _tool_action(rng, kind)
        lines = content.tool_output(rng, kind, rng.randrange(8, 20)).split("\n")
        used += (
            count_tokens(render_call(*action))
            + sum(count_tokens(line + "\n") for line in lines)
            + round_markup
        )
        actions.append(action)
        results.append(lines)
    while trim and results and len(results[-1]) > 1:
        cost = count_tokens(results[-1][-1] + "\n")
        if used - cost < budget:
            break
        used -= cost
        results[-1].pop()
    flat = [(r, line) for r, lines in enumerate(results) for line in lines]
    marked = _insert([f"{r}\x00{line}" for r, line in flat], needles)
    regrouped: list[list[str]] = [[] for _ in results]
    last_round = 0
    for unit in marked:
        round_text, sep, line = unit.partition("\x00")
        if sep:
            last_round = int(round_text)
            regrouped[last_round].append(line)
        else:  # a needle: joins the round of the line before it (or the first round)
            regrouped[last_round].append(unit)
    return [(*action, lines) for action, lines in zip(actions, regrouped, strict=True)]


def _tool_messages(
    rng: random.Random,
    budget: int,
    needles: list[tuple[float, str]],
    count_tokens: Callable[[str], int],
    question: str,
) -> list[Message]:
    """Rounds of (tool call, tool result); the needles are lines of the results."""
    rounds = tool_rounds(rng, budget, needles, count_tokens, _tool_call_text)
    messages = [
        Message(Role.SYSTEM, AGENT_SYSTEM_PROMPT),
        Message(Role.USER, _TOOLS_TASK),
    ]
    for name, key, arg, lines in rounds:
        messages.append(Message(Role.ASSISTANT, _tool_call_text(name, key, arg)))
        messages.append(Message(Role.TOOL, "\n".join(lines)))
    messages.append(Message(Role.ASSISTANT, _TOOLS_ACK))
    messages.append(Message(Role.USER, question))
    return messages


def _tool_action(rng: random.Random, kind: int) -> tuple[str, str, str]:
    """(tool name, argument name, argument) of the round's call."""
    kind %= 4
    if kind == 0:
        return "run_command", "command", f"tail -n 20 logs/{rng.choice(content.SERVICES)}.log"
    if kind == 1:
        return "query_db", "sql", f"SELECT * FROM orders LIMIT {rng.randrange(5, 30)}"
    if kind == 2:
        return "read_file", "path", f"src/{rng.choice(content.NOUNS)}_service.py"
    return "read_file", "path", f"docs/{rng.choice(content.NOUNS)}.txt"


def _tool_call_text(name: str, _key: str, arg: str) -> str:
    """The `tools` layout's call: Hermes text in the assistant content, one `input` argument."""
    return f'<tool_call>{{"name": "{name}", "arguments": {{"input": "{arg}"}}}}</tool_call>'
