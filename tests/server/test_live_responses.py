"""The Responses API (`/v1/responses`) through the official `openai` client, on the real
server and SmolLM2-135M.

A response is one chat turn on the same KVMem session, so at temperature 0 it must produce
exactly the text of the equivalent chat completion, and count the same prompt tokens.
Tool calls are forced with `tool_choice` (a grammar), which makes them deterministic.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.server.conftest import LiveServer

pytestmark = pytest.mark.slow

ASK = "Name a color."
TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather of a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "London", "Tokyo"]}},
        "required": ["city"],
    },
}
FORCE = {"type": "function", "name": "get_weather"}


def _chat_twin(server: LiveServer, max_tokens: int) -> tuple[str, int]:
    chat = server.client().chat.completions.create(
        model="smol",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": ASK}],
        temperature=0,
        max_tokens=max_tokens,
    )
    assert chat.usage is not None
    return chat.choices[0].message.content or "", chat.usage.prompt_tokens


def test_non_stream_matches_chat_completions(main_server: LiveServer) -> None:
    client = main_server.client()
    response = client.responses.create(
        model="smol", instructions="Be brief.", input=ASK, temperature=0, max_output_tokens=12
    )
    text, prompt_tokens = _chat_twin(main_server, 12)
    assert response.object == "response" and response.id.startswith("resp_")
    assert [item.type for item in response.output] == ["message"]
    assert response.output_text == text and text
    assert response.usage is not None
    assert response.usage.input_tokens == prompt_tokens
    assert 1 <= response.usage.output_tokens <= 12
    assert response.usage.total_tokens == prompt_tokens + response.usage.output_tokens
    if response.usage.output_tokens == 12:
        assert response.status == "incomplete"
        assert response.incomplete_details is not None
        assert response.incomplete_details.reason == "max_output_tokens"
    else:
        assert response.status == "completed"
    assert response.instructions == "Be brief." and response.max_output_tokens == 12


def test_stream_event_sequence(main_server: LiveServer) -> None:
    client = main_server.client()
    events = list(
        client.responses.create(
            model="smol",
            instructions="Be brief.",
            input=ASK,
            temperature=0,
            max_output_tokens=12,
            stream=True,
        )
    )
    text, _ = _chat_twin(main_server, 12)
    types = [e.type for e in events]
    n_deltas = types.count("response.output_text.delta")
    final = events[-1].type
    assert final in ("response.completed", "response.incomplete")
    assert types == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * n_deltas,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        final,
    ]
    assert n_deltas >= 1
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == text
    done = next(e for e in events if e.type == "response.output_text.done")
    assert done.text == text
    assert events[-1].response.output_text == text  # type: ignore[union-attr]
    assert events[0].response.status == "in_progress"  # type: ignore[union-attr]


def test_forced_function_call_and_its_output_round_trip(main_server: LiveServer) -> None:
    client = main_server.client()
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    stream = client.responses.create(
        model="smol",
        input=ask,
        tools=[TOOL],
        tool_choice=FORCE,
        temperature=0,
        max_output_tokens=40,
        stream=True,
    )
    events = list(stream)
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    first = events[-1].response  # type: ignore[union-attr]
    assert first.status == "completed"
    assert [i.type for i in first.output] == ["function_call"]
    call = first.output[0]
    assert call.type == "function_call"
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    assert json.loads(call.arguments)["city"] in ("Paris", "London", "Tokyo")
    assert events[4].arguments == call.arguments  # type: ignore[union-attr]
    assert events[3].delta == call.arguments  # type: ignore[union-attr]

    second = client.responses.create(
        model="smol",
        input=[
            *ask,
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C."},
        ],
        tools=[TOOL],
        temperature=0,
        max_output_tokens=16,
    )
    assert second.output and second.usage is not None and first.usage is not None
    assert second.output[0].type in ("message", "function_call")
    # the follow-up reuses the KV of the prompt and of the call the model generated
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens


def test_previous_response_id_continues_from_the_kv(main_server: LiveServer) -> None:
    client = main_server.client()
    first = client.responses.create(
        model="smol", input="My name is Ada.", temperature=0, max_output_tokens=10
    )
    second = client.responses.create(
        model="smol",
        input="What is my name?",
        previous_response_id=first.id,
        temperature=0,
        max_output_tokens=10,
    )
    assert second.previous_response_id == first.id
    assert first.usage is not None and second.usage is not None
    cached = second.usage.input_tokens_details.cached_tokens
    assert first.usage.input_tokens <= cached < second.usage.input_tokens
    # the continuation's prompt holds the first turn, its answer and the new input
    replay = client.chat.completions.create(
        model="smol",
        messages=[
            {"role": "user", "content": "My name is Ada."},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "What is my name?"},
        ],
        temperature=0,
        max_tokens=10,
    )
    assert replay.usage is not None and replay.usage.prompt_tokens == second.usage.input_tokens
    assert replay.choices[0].message.content == second.output_text
    assert client.responses.retrieve(first.id).output_text == first.output_text
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"input": "hi", "tools": [{"type": "web_search"}]}, 400, "tools[0].type"),
        ({"input": "hi", "previous_response_id": "resp_missing"}, 404, "previous_response_id"),
        ({"input": [{"type": "input_image", "image_url": "x"}]}, 400, "input[0].type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file"}]}]},
            400,
            "input[0].content[0].type",
        ),
        ({"input": "hi", "background": True}, 400, "background"),
        ({"input": "hi", "max_output_tokens": 0}, 400, "max_output_tokens"),
        ({"input": "hi", "tool_choice": "required"}, 400, "tool_choice"),
        ({"input": 5}, 400, "input"),
        ({}, 400, "input"),
    ],
)
def test_bad_requests_get_4xx_in_the_openai_envelope(
    main_server: LiveServer, body: dict, status: int, param: str
) -> None:
    with httpx.Client(base_url=main_server.base_url, timeout=60) as http:
        response = http.post("/v1/responses", json={"model": "smol", **body})
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert error["param"] == param and error["message"]
        assert error["type"] == "invalid_request_error"
        ok = http.post("/v1/responses", json={"input": "hi", "max_output_tokens": 2})
        assert ok.status_code == 200 and ok.json()["output"][0]["type"] == "message"


def test_sdk_raises_on_unsupported_tools(main_server: LiveServer) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        main_server.client().responses.create(
            model="smol",
            input="hi",
            tools=[{"type": "web_search"}],  # type: ignore[list-item]
        )
    assert info.value.status_code == 400 and "only function tools" in info.value.message
