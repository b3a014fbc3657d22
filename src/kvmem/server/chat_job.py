"""A validated chat request turned into a job for the engine worker.

Everything that does not need the engine happens here, in the request handler, so bad
requests fail with 400 at once instead of after waiting for the slot: message validation,
thinking controls, template rendering (with the query span), grammars, sampling.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from typing import Any

from kvmem.chat.images import ImageCollector
from kvmem.chat.json_grammar import json_object_grammar, json_schema_grammar
from kvmem.chat.messages import normalize_messages
from kvmem.chat.prefill import plan_prefill
from kvmem.chat.prompt import PromptTokens, RenderedPrompt, render_prompt
from kvmem.chat.reasoning import ReasoningMarkers
from kvmem.chat.schema_check import check_grammar_text
from kvmem.chat.template import ChatTemplate
from kvmem.chat.thinking import ThinkingPlan, resolve_thinking
from kvmem.chat.tool_calls import ToolFormat
from kvmem.chat.tool_grammar import tool_call_grammar
from kvmem.chat.turn import TurnRequest
from kvmem.sampling import SamplingParams
from kvmem.server.channel import EventChannel
from kvmem.server.harness_pins import PinLimit, pin_harness
from kvmem.server.kvmem_options import conversation_of
from kvmem.server.live_timings import TimingProbe
from kvmem.server.prompt_progress import ProgressReporter
from kvmem.server.schemas import ChatCompletionRequest, NamedToolChoice
from kvmem.server.settings import ServerSettings


@dataclass(slots=True)
class ChatJob:
    rendered: RenderedPrompt
    sampling: SamplingParams
    channel: EventChannel
    max_tokens: int = -1  # 0: prefill only
    stop: tuple[str, ...] = ()
    grammar: str | None = None
    tool_format: ToolFormat | None = None
    tools: list[dict[str, Any]] = field(default_factory=list)
    parallel_tool_calls: bool = True
    reasoning: ReasoningMarkers | None = None
    reasoning_budget: int = -1
    budget_message: str = ""
    ignore_eos: bool = False
    banned_tokens: tuple[int, ...] = ()
    top_logprobs: int | None = None
    timing_probe: TimingProbe | None = None  # timings_per_token
    progress: ProgressReporter | None = None  # return_progress
    conversation_id: str | None = None  # kvmem.conversation_id: the conversation it runs on
    pin_limit: PinLimit | None = None  # an agent harness's pinned set (server/harness_pins.py)
    cancel: threading.Event = field(default_factory=threading.Event)

    def another_choice(self, channel: EventChannel) -> ChatJob:
        """The same request as another choice (n > 1): the same rendering, its own
        channel and cancel event."""
        return replace(
            self, channel=channel, cancel=threading.Event(), timing_probe=None, progress=None
        )

    def turn_request(self, prompt: PromptTokens) -> TurnRequest:
        return TurnRequest(
            prompt=prompt,
            sampling=self.sampling,
            max_tokens=self.max_tokens,
            stop=self.stop,
            grammar=self.grammar,
            tool_format=self.tool_format,
            tools=self.tools,
            parallel_tool_calls=self.parallel_tool_calls,
            reasoning=self.reasoning,
            reasoning_budget=self.reasoning_budget,
            budget_message=self.budget_message,
            cancel=self.cancel,
            ignore_eos=self.ignore_eos,
            banned_tokens=self.banned_tokens,
            top_logprobs=self.top_logprobs,
        )


def output_limit(asked: int | None, server_default: int) -> int:
    """llama-server's rule: a request's own limit wins (0: prefill only); a request that
    says nothing (None or -1) gets the server's `-n` (-1 there: until an end-of-generation
    token or the full context, which the session never passes)."""
    return server_default if asked is None or asked == -1 else asked


def effective_max_tokens(
    request: ChatCompletionRequest, n_predict: int, tool_max_tokens: int = -1
) -> int:
    """max_completion_tokens, else max_tokens; a request that sets neither (or -1) gets
    `-n`, and with tools also at most `--tool-max-tokens`; -1 means until the context."""
    asked = (
        request.max_completion_tokens
        if request.max_completion_tokens is not None
        else request.max_tokens
    )
    tools = request.tools and request.tool_choice != "none"
    defaults = [v for v in (n_predict, tool_max_tokens if tools else -1) if v > 0]
    return output_limit(asked, min(defaults) if defaults else -1)


def sampling_for(request: ChatCompletionRequest, defaults: SamplingParams) -> SamplingParams:
    overrides = {
        name: getattr(request, name)
        for name in (
            "temperature",
            "top_k",
            "top_p",
            "min_p",
            "repeat_penalty",
            "presence_penalty",
            "frequency_penalty",
            "seed",
        )
        if getattr(request, name) is not None
    }
    return replace(defaults, **overrides)


def _grammar(
    request: ChatCompletionRequest, template: ChatTemplate, tools: list[dict[str, Any]]
) -> str | None:
    choice = request.tool_choice
    parallel = bool(request.parallel_tool_calls)
    if tools and choice == "required":
        return tool_call_grammar(template.tool_format, tools, parallel=parallel)
    if tools and isinstance(choice, NamedToolChoice):
        return tool_call_grammar(template.tool_format, tools, only=choice.function.name)
    if request.grammar is not None:
        check_grammar_text(request.grammar)
        return request.grammar
    if request.json_schema is not None:
        return json_schema_grammar(request.json_schema, "json_schema")
    fmt = request.response_format
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return json_schema_grammar(fmt.schema_) if fmt.schema_ else json_object_grammar()
    assert fmt.json_schema is not None  # the schema validator guarantees it
    return json_schema_grammar(fmt.json_schema.schema_)


@dataclass(slots=True)
class RenderedChat:
    """A chat request rendered through the template: the prompt, its thinking plan and the
    tools it offers (none with tool_choice "none")."""

    prompt: RenderedPrompt
    thinking: ThinkingPlan
    tools: list[dict[str, Any]]


def render_chat(
    request: ChatCompletionRequest,
    settings: ServerSettings,
    template: ChatTemplate,
    images: ImageCollector | None = None,
) -> RenderedChat:
    """Validate the messages and render them (the chat route, /apply-template and the
    input_tokens routes); raises InvalidRequestError/TemplateError for a bad request."""
    messages = normalize_messages(request.messages, vision=images is not None, images=images)
    plan = resolve_thinking(
        settings.thinking,
        reasoning_effort=request.reasoning_effort,
        chat_template_kwargs=request.chat_template_kwargs,
        reasoning_budget_tokens=request.reasoning_budget_tokens,
    )
    tools = request.tool_dicts if request.tool_choice != "none" else []
    prefill = plan_prefill(
        request.messages,
        messages,
        add_generation_prompt=request.add_generation_prompt,
        continue_final_message=request.continue_final_message,
    )
    rendered = render_prompt(
        template,
        prefill.messages,
        tools=tools or None,
        template_kwargs=plan.template_kwargs,
        add_generation_prompt=prefill.add_generation_prompt,
        prefill=prefill.text,
    )
    return RenderedChat(rendered, plan, tools)


def prepare_chat_job(
    request: ChatCompletionRequest,
    settings: ServerSettings,
    template: ChatTemplate,
    channel: EventChannel,
) -> ChatJob:
    """Validate and render; raises InvalidRequestError/TemplateError for a bad request."""
    images = ImageCollector(settings.media_path) if settings.mmproj else None
    chat = render_chat(request, settings, template, images)
    rendered, plan, tools = chat.prompt, chat.thinking, chat.tools
    if images is not None and images.images:
        rendered.images, rendered.image_marker = tuple(images.images), images.marker
    if settings.reasoning_format == "none":  # thinking stays in the content, tags included
        rendered.opens_reasoning = False
    pins = pin_harness(rendered, request.messages, tools, settings.engine.kvmem)
    return ChatJob(
        rendered=rendered,
        sampling=sampling_for(request, settings.sampling),
        channel=channel,
        max_tokens=effective_max_tokens(request, settings.n_predict, settings.tool_max_tokens),
        stop=request.stop_list,
        grammar=_grammar(request, template, tools),
        tool_format=template.tool_format if tools else None,
        tools=tools,
        parallel_tool_calls=request.parallel_tool_calls is not False,
        reasoning=None if settings.reasoning_format == "none" else template.reasoning,
        reasoning_budget=plan.budget,
        budget_message=settings.budget_message,
        ignore_eos=bool(request.ignore_eos),
        top_logprobs=(request.top_logprobs or 0) if request.logprobs else None,
        timing_probe=TimingProbe() if request.timings_per_token and request.stream else None,
        progress=(
            ProgressReporter(channel, timings=bool(request.timings_per_token))
            if request.return_progress and request.stream
            else None
        ),
        conversation_id=conversation_of(request.kvmem),
        pin_limit=pins,
    )
