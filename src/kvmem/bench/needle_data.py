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
from kvmem.bench.haystack import MARKUP_TOKENS, insert_needles, tool_rounds
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
    overhead = sum(count_tokens(text) for text in fixed) + 5 * MARKUP_TOKENS
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
    document = " ".join(insert_needles(sentences, needles))
    return [
        Message(Role.SYSTEM, SYSTEM_PROMPT),
        Message(Role.USER, _DOCUMENT_INTRO + document),
        Message(Role.ASSISTANT, _ACK),
        Message(Role.USER, question),
    ]


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


def _tool_call_text(name: str, _key: str, arg: str) -> str:
    """The `tools` layout's call: Hermes text in the assistant content, one `input` argument."""
    return f'<tool_call>{{"name": "{name}", "arguments": {{"input": "{arg}"}}}}</tool_call>'
