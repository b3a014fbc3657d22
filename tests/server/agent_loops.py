"""Real agent frameworks driving one tool loop against a live server (issue 29, item 2).

Each runner gives its framework one tool, `get_weather(city)`, and the question "What is the
weather in Paris?", lets the framework run its own loop (its own prompts, tool schemas,
message history and parsing) for at most `MAX_TURNS` model requests, and returns what
happened as a `LoopOutcome`: the framework's final answer, or the name of the error that
ended the loop, and every call the framework made to the tool.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field

QUESTION = "What is the weather in Paris?"
INSTRUCTIONS = "You are a weather assistant. Use the get_weather tool, then answer in one sentence."
WEATHER = "Sunny, 21 C"
MAX_TURNS = 2
MAX_TOKENS = 96
API_KEY = "sk-test"


@dataclass(slots=True)
class LoopOutcome:
    framework: str
    final: str | None = None  # the framework's final answer, when the loop ended with one
    error: str | None = None  # the exception type that ended the loop otherwise
    tool_cities: list[str] = field(default_factory=list)  # each call the framework executed

    @property
    def finished(self) -> bool:
        return self.final is not None


def _weather_tool(outcome: LoopOutcome) -> Callable[[str], str]:
    def get_weather(city: str) -> str:
        """Get the current weather in a city.

        Args:
            city: the city's name.
        """
        outcome.tool_cities.append(city)
        return f"{WEATHER} in {city}"

    return get_weather


def _run(
    name: str, body: Callable[[LoopOutcome], str], *errors: type[BaseException]
) -> LoopOutcome:
    outcome = LoopOutcome(name)
    try:
        outcome.final = body(outcome)
    except errors as exc:  # the framework's own "too many turns" error
        outcome.error = type(exc).__name__
    return outcome


def openai_agents(base_url: str, *, responses: bool) -> LoopOutcome:
    import agents
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=base_url, api_key=API_KEY)
    model_type = agents.OpenAIResponsesModel if responses else agents.OpenAIChatCompletionsModel

    def body(outcome: LoopOutcome) -> str:
        agent = agents.Agent(
            name="weather",
            instructions=INSTRUCTIONS,
            tools=[agents.function_tool(_weather_tool(outcome))],
            model=model_type(model="qwen", openai_client=client),
            model_settings=agents.ModelSettings(temperature=0, max_tokens=MAX_TOKENS),
        )
        result = asyncio.run(agents.Runner.run(agent, QUESTION, max_turns=MAX_TURNS))
        return str(result.final_output)

    name = "openai-agents-responses" if responses else "openai-agents-chat"
    return _run(name, body, agents.MaxTurnsExceeded)


def pydantic_ai(base_url: str) -> LoopOutcome:
    from pydantic_ai import Agent, UsageLimitExceeded, UsageLimits
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel("qwen", provider=OpenAIProvider(base_url=base_url, api_key=API_KEY))

    def body(outcome: LoopOutcome) -> str:
        agent = Agent(model, instructions=INSTRUCTIONS, tools=[_weather_tool(outcome)])
        result = agent.run_sync(
            QUESTION,
            model_settings={"temperature": 0, "max_tokens": MAX_TOKENS},
            usage_limits=UsageLimits(request_limit=MAX_TURNS),
        )
        return str(result.output)

    return _run("pydantic-ai", body, UsageLimitExceeded)


def smolagents(base_url: str) -> LoopOutcome:
    import smolagents as sa

    def body(outcome: LoopOutcome) -> str:
        tool = sa.tool(_weather_tool(outcome))
        model = sa.OpenAIServerModel(
            model_id="qwen",
            api_base=base_url,
            api_key=API_KEY,
            temperature=0,
            max_tokens=MAX_TOKENS,
        )
        agent = sa.ToolCallingAgent(
            tools=[tool], model=model, max_steps=MAX_TURNS, verbosity_level=0
        )
        return str(agent.run(QUESTION))

    return _run("smolagents", body, sa.AgentMaxStepsError)


def langgraph_react(base_url: str) -> LoopOutcome:
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.errors import GraphRecursionError
    from langgraph.prebuilt import create_react_agent

    chat = ChatOpenAI(
        model="qwen", base_url=base_url, api_key=API_KEY, temperature=0, max_tokens=MAX_TOKENS
    )

    def body(outcome: LoopOutcome) -> str:
        agent = create_react_agent(chat, [tool(_weather_tool(outcome))], prompt=INSTRUCTIONS)
        # a model turn and a tool turn are a graph step each: MAX_TURNS of both, and the step
        # that would ask the model again is over the limit
        state = agent.invoke(
            {"messages": [("user", QUESTION)]}, {"recursion_limit": 2 * MAX_TURNS + 1}
        )
        return str(state["messages"][-1].content)

    return _run("langgraph", body, GraphRecursionError)


class _TurnsExceeded(RuntimeError):
    """A hand-written SDK loop asked the model more than MAX_TURNS times."""


def anthropic_sdk(base_url: str) -> LoopOutcome:
    import anthropic

    client = anthropic.Anthropic(base_url=base_url.removesuffix("/v1"), api_key=API_KEY)
    tools = [
        {
            "name": "get_weather",
            "description": "Get the current weather in a city.",
            "input_schema": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        }
    ]

    def body(outcome: LoopOutcome) -> str:
        weather = _weather_tool(outcome)
        messages: list[dict] = [{"role": "user", "content": QUESTION}]
        for _ in range(MAX_TURNS):
            reply = client.messages.create(
                model="qwen",
                system=INSTRUCTIONS,
                messages=messages,
                tools=tools,
                max_tokens=MAX_TOKENS,
                extra_body={"temperature": 0},
            )
            uses = [b for b in reply.content if b.type == "tool_use"]
            if reply.stop_reason != "tool_use":
                return "".join(b.text for b in reply.content if b.type == "text")
            messages.append(
                {"role": "assistant", "content": [b.model_dump() for b in reply.content]}
            )
            results = [
                {"type": "tool_result", "tool_use_id": u.id, "content": weather(**u.input)}
                for u in uses
            ]
            messages.append({"role": "user", "content": results})
        raise _TurnsExceeded

    return _run("anthropic", body, _TurnsExceeded)


def openai_responses(base_url: str) -> LoopOutcome:
    import openai

    client = openai.OpenAI(base_url=base_url, api_key=API_KEY)
    tools = [
        {
            "type": "function",
            "name": "get_weather",
            "description": "Get the current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        }
    ]

    def body(outcome: LoopOutcome) -> str:
        weather = _weather_tool(outcome)
        items: list = [{"role": "user", "content": QUESTION}]
        for _ in range(MAX_TURNS):
            reply = client.responses.create(
                model="qwen",
                instructions=INSTRUCTIONS,
                input=items,
                tools=tools,
                max_output_tokens=MAX_TOKENS,
                temperature=0,
            )
            calls = [o for o in reply.output if o.type == "function_call"]
            if not calls:
                return reply.output_text
            for call in calls:
                items.append(call.model_dump(exclude_none=True))
                args = json.loads(call.arguments)
                items.append(
                    {
                        "type": "function_call_output",
                        "call_id": call.call_id,
                        "output": weather(**args),
                    }
                )
        raise _TurnsExceeded

    return _run("openai-responses", body, _TurnsExceeded)


RUNNERS: dict[str, Callable[[str], LoopOutcome]] = {
    "openai-agents-chat": lambda url: openai_agents(url, responses=False),
    "openai-agents-responses": lambda url: openai_agents(url, responses=True),
    "pydantic-ai": pydantic_ai,
    "smolagents": smolagents,
    "langgraph": langgraph_react,
    "anthropic": anthropic_sdk,
    "openai-responses": openai_responses,
}
