"""The Anthropic Messages API (`/v1/messages`) through the official `anthropic` client, on
the real server (the API-key server: Anthropic clients send `x-api-key`) and SmolLM2-135M.

A message is one chat turn on the KVMem session, so at temperature 0 its text is exactly
the equivalent chat completion's. Tool use is forced with tool_choice {"type": "tool"}.
"""

from __future__ import annotations

import anthropic
import httpx
import pytest

from tests.server.conftest import AUTH_KEY_FILE, REQUEST_TIMEOUT_S, LiveServer

pytestmark = pytest.mark.slow

KEY = "sk-cli-1"
T0 = {"temperature": 0}  # the SDK has no temperature argument; the API field stays
SYSTEM = "Be brief."
ASK = [{"role": "user", "content": "Name a color."}]
TOOL = {
    "name": "get_weather",
    "description": "Current weather of a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "London", "Tokyo"]}},
        "required": ["city"],
    },
}


def _client(server: LiveServer, key: str = KEY) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=server.base_url, api_key=key, timeout=REQUEST_TIMEOUT_S, max_retries=0
    )


def _chat_text(server: LiveServer, max_tokens: int) -> tuple[str, int]:
    chat = server.client(KEY).chat.completions.create(
        model="smol",
        messages=[{"role": "system", "content": SYSTEM}, *ASK],
        extra_body=T0,
        max_tokens=max_tokens,
    )
    assert chat.usage is not None
    return chat.choices[0].message.content or "", chat.usage.prompt_tokens


def test_non_stream_count_tokens_and_stop_sequence(auth_server: LiveServer) -> None:
    client = _client(auth_server)
    message = client.messages.create(
        model="smol", system=SYSTEM, messages=ASK, max_tokens=12, extra_body=T0
    )
    text, prompt_tokens = _chat_text(auth_server, 12)
    assert message.type == "message" and message.role == "assistant"
    assert message.id.startswith("msg_")
    assert [b.type for b in message.content] == ["text"]
    assert message.content[0].text == text and text  # type: ignore[union-attr]
    usage = message.usage
    assert usage.input_tokens + (usage.cache_read_input_tokens or 0) == prompt_tokens
    assert 1 <= usage.output_tokens <= 12
    assert message.stop_reason == ("max_tokens" if usage.output_tokens == 12 else "end_turn")
    assert message.stop_sequence is None

    counted = client.messages.count_tokens(model="smol", system=SYSTEM, messages=ASK)
    assert counted.input_tokens == prompt_tokens

    stop = text.strip()[2:5]
    assert len(stop) == 3
    stopped = client.messages.create(
        model="smol",
        system=SYSTEM,
        messages=ASK,
        max_tokens=12,
        extra_body=T0,
        stop_sequences=[stop],
    )
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == stop
    assert stopped.content[0].text == text[: text.find(stop)]  # type: ignore[union-attr]


def test_stream_event_sequence(auth_server: LiveServer) -> None:
    client = _client(auth_server)
    text, _ = _chat_text(auth_server, 12)
    events = list(
        client.messages.create(
            model="smol", system=SYSTEM, messages=ASK, max_tokens=12, extra_body=T0, stream=True
        )
    )
    types = [e.type for e in events]
    n = types.count("content_block_delta")
    assert types == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * n,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert n >= 1
    assert "".join(e.delta.text for e in events if e.type == "content_block_delta") == text  # type: ignore[union-attr]
    delta = events[-2]
    assert delta.type == "message_delta" and delta.usage.output_tokens >= 1
    # the raw stream also carries the ping the SDK skips
    with httpx.Client(base_url=auth_server.base_url, timeout=REQUEST_TIMEOUT_S) as http:
        raw = http.post(
            "/v1/messages",
            headers={"x-api-key": KEY},
            json={"model": "smol", "messages": ASK, "max_tokens": 2, "stream": True},
        )
    names = [line[len("event: ") :] for line in raw.text.splitlines() if line.startswith("event: ")]
    assert names[:2] == ["message_start", "ping"] and names[-1] == "message_stop"


def test_forced_tool_use_and_tool_result_round_trip(auth_server: LiveServer) -> None:
    client = _client(auth_server)
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    with client.messages.stream(
        model="smol",
        messages=ask,
        tools=[TOOL],
        tool_choice={"type": "tool", "name": "get_weather"},
        max_tokens=40,
        extra_body=T0,
    ) as stream:
        types = [e.type for e in stream]
        first = stream.get_final_message()  # the SDK joins the input_json_delta into input
    assert [t for t in types if t != "input_json"] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert first.stop_reason == "tool_use"
    assert [b.type for b in first.content] == ["tool_use"]
    use = first.content[0]
    assert use.type == "tool_use" and use.name == "get_weather" and use.id.startswith("toolu_")
    assert use.input["city"] in ("Paris", "London", "Tokyo")  # type: ignore[index]

    second = client.messages.create(
        model="smol",
        messages=[
            *ask,
            {
                "role": "assistant",
                "content": [b.model_dump(exclude_none=True) for b in first.content],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": use.id, "content": "Sunny, 21 C."}
                ],
            },
        ],
        tools=[TOOL],
        max_tokens=16,
        extra_body=T0,
    )
    assert second.content and second.stop_reason in ("end_turn", "max_tokens", "tool_use")
    # the follow-up reuses the KV of the prompt and of the call the model generated
    first_prompt = first.usage.input_tokens + (first.usage.cache_read_input_tokens or 0)
    assert (second.usage.cache_read_input_tokens or 0) >= first_prompt


def test_x_api_key_auth(auth_server: LiveServer) -> None:
    with httpx.Client(base_url=auth_server.base_url, timeout=60) as http:
        body = {"model": "smol", "messages": ASK, "max_tokens": 2}
        missing = http.post("/v1/messages", json=body)
        assert missing.status_code == 401
        assert missing.json()["type"] == "error"
        assert missing.json()["error"]["type"] == "authentication_error"
        ok = http.post("/v1/messages", json=body, headers={"x-api-key": AUTH_KEY_FILE})
        assert ok.status_code == 200 and ok.json()["type"] == "message"
        assert http.post("/v1/messages/count_tokens", json=body).status_code == 401
    with pytest.raises(anthropic.AuthenticationError) as info:
        _client(auth_server, "sk-wrong").messages.create(model="smol", messages=ASK, max_tokens=2)
    assert info.value.status_code == 401
    assert info.value.body == {
        "type": "error",
        "error": {"type": "authentication_error", "message": "invalid API key"},
    }


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"messages": ASK}, "max_tokens"),
        ({"messages": ASK, "max_tokens": 0}, "max_tokens"),
        ({"messages": ASK, "max_tokens": 4, "service_tier": "auto"}, "service_tier"),
        (
            {
                "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}],
                "max_tokens": 4,
            },
            "messages.0.content.0.type",
        ),
        (
            {
                "messages": ASK,
                "max_tokens": 4,
                "tools": [{"type": "web_search_20250305", "name": "w"}],
            },
            "tools.0.type",
        ),
        ({"messages": ASK, "max_tokens": 4, "tool_choice": {"type": "tool"}}, "tool_choice"),
        ({"messages": [{"role": "system", "content": "x"}], "max_tokens": 4}, "messages.0.role"),
        ({"messages": ASK, "max_tokens": 4, "temperature": 1.5}, "temperature"),
    ],
)
def test_bad_requests_get_4xx_in_the_anthropic_envelope(
    auth_server: LiveServer, body: dict, where: str
) -> None:
    with httpx.Client(
        base_url=auth_server.base_url, timeout=60, headers={"x-api-key": KEY}
    ) as http:
        response = http.post("/v1/messages", json={"model": "smol", **body})
        assert response.status_code == 400, response.text
        payload = response.json()
        assert payload["type"] == "error"
        assert payload["error"]["type"] == "invalid_request_error"
        assert where in payload["error"]["message"]
        ok = http.post("/v1/messages", json={"model": "smol", "messages": ASK, "max_tokens": 2})
        assert ok.status_code == 200 and ok.json()["content"][0]["type"] == "text"
    with pytest.raises(anthropic.BadRequestError):
        _client(auth_server).messages.create(model="smol", messages=ASK, max_tokens=0)
