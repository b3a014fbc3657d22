"""One assistant turn: drive `engine.generate` and turn its tokens into chat events.

Pipeline per token: incremental UTF-8 detokenization -> stop strings -> thinking split ->
tool-call detection. Generation stops once the tool-call stream says the reply is complete
(a call block closed and what follows opens no further call), as llama-server's tool
grammar ends there; a call cut off by max_tokens leaves the finish at `length`.

Generation runs in segments over the same session; a new segment starts (reusing the
whole history as a cached prefix) when
- the thinking budget runs out: the thinking block is closed by appending its close tag
  (after `--reasoning-budget-message`, if any) and the answer continues;
- the thinking block closes and a grammar (forced tool call, response_format) waits:
  thinking is free text, the answer is constrained.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from kvmem.chat.detokenize import IncrementalDetokenizer
from kvmem.chat.logprobs import token_probs
from kvmem.chat.prompt import PromptTokens
from kvmem.chat.protocol import ChatEngine
from kvmem.chat.reasoning import Channel, ReasoningMarkers, ReasoningSplitter
from kvmem.chat.stop import StopMatcher
from kvmem.chat.tool_calls import ToolCall, ToolFormat
from kvmem.chat.tool_stream import ToolCallStream
from kvmem.chat.turn_memory import TurnMemory
from kvmem.sampling import SamplingParams


class ChatFinish(Enum):
    STOP = "stop"
    LENGTH = "length"
    TOOL_CALLS = "tool_calls"
    CANCELLED = "cancelled"


@dataclass(slots=True)
class TurnRequest:
    prompt: PromptTokens
    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int = -1  # the whole output, thinking included; -1: no limit
    stop: tuple[str, ...] = ()
    grammar: str | None = None
    tool_format: ToolFormat | None = None  # parse tool calls in this format; None: never
    tools: list[dict[str, Any]] = field(default_factory=list)
    parallel_tool_calls: bool = True  # False: the first call ends the reply
    reasoning: ReasoningMarkers | None = None
    reasoning_budget: int = -1
    budget_message: str = ""
    cancel: threading.Event | None = None
    ignore_eos: bool = False  # end-of-generation tokens are banned (llama-server's ignore_eos)
    banned_tokens: tuple[int, ...] = ()  # logit_bias bans
    top_logprobs: int | None = None  # emit TokenLogprobs per token with this many alternatives


@dataclass(slots=True)
class TextDelta:
    channel: Channel
    text: str


@dataclass(slots=True)
class TokenLogprobs:
    """One generated token's log-probability and the top alternatives (chat `logprobs`)."""

    token: int
    piece: bytes
    logprob: float
    top: tuple[tuple[int, bytes, float], ...]


@dataclass(slots=True)
class ToolCallEvent:
    index: int
    call: ToolCall


@dataclass(slots=True)
class TurnUsage:
    prompt_tokens: int = 0
    cached_tokens: int = 0  # the reused prefix of the session history
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    prefill_ms: float = 0.0
    decode_ms: float = 0.0
    memory: TurnMemory = field(default_factory=TurnMemory)

    @property
    def prefill_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens


@dataclass(slots=True)
class TurnDone:
    finish_reason: ChatFinish
    usage: TurnUsage
    stop_word: str = ""  # the stop string that ended the turn (finish STOP), else ""


TurnEvent = TextDelta | ToolCallEvent | TokenLogprobs | TurnDone


class _Output:
    """Text -> events, through the thinking splitter and the tool-call detector."""

    def __init__(self, splitter: ReasoningSplitter, tools: ToolCallStream | None) -> None:
        self.splitter = splitter
        self.tools = tools
        self.n_calls = 0

    def push(self, text: str) -> list[TurnEvent]:
        return self._route(self.splitter.push(text)) if text else []

    def finish(self) -> list[TurnEvent]:
        events = self._route(self.splitter.flush())
        if self.tools is not None:
            events += self._content(self.tools.finish())
        return events

    def _route(self, pieces: list[Any]) -> list[TurnEvent]:
        events: list[TurnEvent] = []
        for piece in pieces:
            if piece.channel is Channel.REASONING or self.tools is None:
                events.append(TextDelta(piece.channel, piece.text))
            else:
                events += self._content(self.tools.push(piece.text))
        return events

    def _content(self, items: list[str | ToolCall]) -> list[TurnEvent]:
        events: list[TurnEvent] = []
        for item in items:
            if isinstance(item, ToolCall):
                events.append(ToolCallEvent(self.n_calls, item))
                self.n_calls += 1
            elif item:
                events.append(TextDelta(Channel.CONTENT, item))
        return events


class _SegmentEnd(Enum):
    BUDGET = "budget"
    GRAMMAR = "grammar"


def run_turn(engine: ChatEngine, req: TurnRequest) -> Iterator[TurnEvent]:
    """Generate one assistant turn; the last event is always `TurnDone`. With
    `max_tokens` 0 the prompt is only processed (prefill_only)."""
    if req.max_tokens == 0:
        yield prefill_only(engine, req)
        return
    detok = IncrementalDetokenizer(engine)
    stopper = StopMatcher(req.stop)
    splitter = ReasoningSplitter(req.reasoning, starts_in_reasoning=req.prompt.opens_reasoning)
    tool_stream = (
        ToolCallStream(req.tool_format, req.tools, parallel=req.parallel_tool_calls)
        if req.tool_format
        else None
    )
    out = _Output(splitter, tool_stream)
    usage = TurnUsage(prompt_tokens=len(req.prompt.tokens))
    history = list(req.prompt.tokens)
    budget_used = 0
    first_segment = True
    finish: ChatFinish | None = None

    def budget_spent() -> bool:
        return splitter.in_reasoning and 0 <= req.reasoning_budget <= budget_used

    while finish is None:
        if req.cancel is not None and req.cancel.is_set():
            finish = ChatFinish.CANCELLED
            break
        if budget_spent() and splitter.markers is not None:
            yield from out.push(stopper.flush() + detok.flush())
            forced = f"{req.budget_message}\n{splitter.markers.close}\n\n"
            forced_tokens = engine.tokenize(forced, add_special=False, parse_special=True)
            history += forced_tokens
            usage.completion_tokens += len(forced_tokens)
            yield from out.push(forced)
            continue
        remaining = -1 if req.max_tokens < 0 else req.max_tokens - usage.completion_tokens
        if remaining == 0:
            finish = ChatFinish.LENGTH
            break
        grammar = None if (req.grammar and splitter.in_reasoning) else req.grammar
        ended: _SegmentEnd | None = None
        logits: list[Any] | None = [] if req.top_logprobs is not None else None
        gen = engine.generate(
            history,
            query=req.prompt.spans or req.prompt.query,
            sampling=req.sampling,
            max_tokens=remaining,
            grammar=grammar,
            cancel=req.cancel,
            ignore_eos=req.ignore_eos,
            banned_tokens=req.banned_tokens,
            logits_out=logits,
        )
        try:
            for token in gen:
                if logits:
                    yield _logprobs(engine, logits[-1], token, req.top_logprobs or 0)
                history.append(token)
                usage.completion_tokens += 1
                if splitter.in_reasoning:
                    budget_used += 1
                    usage.reasoning_tokens += 1
                result = stopper.push(detok.push(token))
                yield from out.push(result.text)
                if result.stopped:
                    finish = ChatFinish.STOP
                    break
                if tool_stream is not None and tool_stream.done:
                    finish = ChatFinish.TOOL_CALLS  # the call block is complete
                    break
                if req.grammar and grammar is None and not splitter.in_reasoning:
                    ended = _SegmentEnd.GRAMMAR
                    break
                if budget_spent():
                    ended = _SegmentEnd.BUDGET
                    break
        finally:
            gen.close()
        stats = engine.last_turn
        usage.memory.add(stats)
        if first_segment:
            usage.cached_tokens = stats.cached_tokens
            first_segment = False
        usage.prefill_ms += stats.prefill_ms
        usage.decode_ms += stats.decode_ms
        if finish is None and ended is None:
            finish = ChatFinish(stats.finish_reason)
    if not stopper.stopped:
        tail = stopper.push(detok.flush())
        yield from out.push(tail.text + stopper.flush())
        if tail.stopped:
            finish = ChatFinish.STOP
    yield from out.finish()
    cut_off = tool_stream is not None and tool_stream.cut_off and finish is ChatFinish.LENGTH
    if out.n_calls and finish in (ChatFinish.STOP, ChatFinish.LENGTH) and not cut_off:
        finish = ChatFinish.TOOL_CALLS
    yield TurnDone(finish, usage, stopper.matched if finish is ChatFinish.STOP else "")


def prefill_only(engine: ChatEngine, req: TurnRequest) -> TurnDone:
    """Process the prompt and keep its KV in the session; nothing is sampled. The turn
    ends at `length` with no completion tokens (a later turn reuses the prompt)."""
    engine.teacher_force(req.prompt.tokens, (), query=req.prompt.spans or req.prompt.query)
    stats = engine.last_turn
    usage = TurnUsage(
        prompt_tokens=len(req.prompt.tokens),
        cached_tokens=stats.cached_tokens,
        prefill_ms=stats.prefill_ms,
    )
    usage.memory.add(stats)
    return TurnDone(ChatFinish.LENGTH, usage)


def _logprobs(engine: ChatEngine, logits: Any, token: int, n: int) -> TokenLogprobs:
    chosen, top = token_probs(logits, token, n, None)
    return TokenLogprobs(
        token,
        engine.token_bytes(token),
        chosen.logprob,
        tuple((p.id, engine.token_bytes(p.id), p.logprob) for p in top),
    )
