"""Chat against a real kvmem-server with SmolLM2, through the official openai client."""

from __future__ import annotations

import json

import openai
import pytest

from tests.server.conftest import LiveServer

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "Name one primary color."}]


def test_health_models_props(main_server: LiveServer) -> None:
    with main_server.http() as http:
        assert http.get("/health").json() == {"status": "ok"}
        assert http.get("/v1/health").status_code == 200
        props = http.get("/props").json()
    models = main_server.client().models.list()
    assert [m.id for m in models.data] == ["smol"]
    assert models.data[0].model_extra["meta"]["n_ctx"] == 8192
    assert props["n_ctx"] == 8192
    assert props["default_generation_settings"]["n_ctx"] == 8192
    assert props["total_slots"] == 1
    assert props["model_path"].endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert props["kvmem"]["budget"] == 1024 and props["kvmem"]["gen_reserve"] == 512
    assert props["chat_template"].startswith("{% for message in messages %}")
    assert props["auth"] == {"enabled": False}


def test_non_stream_chat(main_server: LiveServer) -> None:
    response = main_server.client().chat.completions.create(
        model="smol", messages=QUESTION, max_tokens=8, temperature=0
    )
    choice = response.choices[0]
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str) and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    usage = response.usage
    assert usage is not None
    assert usage.completion_tokens <= 8
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    extra = usage.model_extra or {}
    assert (
        extra["prompt_cache_hit_tokens"] + extra["prompt_cache_miss_tokens"] == usage.prompt_tokens
    )
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == extra["prompt_cache_hit_tokens"]


def test_stream_with_usage_and_cached_tokens_on_the_second_turn(main_server: LiveServer) -> None:
    client = main_server.client()
    messages = [{"role": "user", "content": "Say hello to Ada."}]
    stream = client.chat.completions.create(
        model="smol",
        messages=messages,
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finish in (["stop"], ["length"])
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    first_usage = chunks[-1].usage
    assert first_usage.completion_tokens <= 8
    assert len({c.id for c in chunks}) == 1

    messages += [
        {"role": "assistant", "content": text},
        {"role": "user", "content": "And to Grace?"},
    ]
    second = client.chat.completions.create(
        model="smol", messages=messages, max_tokens=4, temperature=0
    )
    assert second.usage is not None and second.usage.prompt_tokens_details is not None
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached is not None and cached >= first_usage.prompt_tokens
    assert (second.usage.model_extra or {})["prompt_cache_hit_tokens"] == cached


def test_json_schema_response_format_goes_through_a_real_grammar(main_server: LiveServer) -> None:
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
        "required": ["answer"],
    }
    response = main_server.client().chat.completions.create(
        model="smol",
        messages=[{"role": "user", "content": "Is the sky blue? Answer in JSON."}],
        temperature=0,
        max_tokens=20,
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
    )
    content = response.choices[0].message.content
    assert content is not None
    assert json.loads(content) in ({"answer": "yes"}, {"answer": "no"})
    assert response.choices[0].finish_reason == "stop"


def test_stop_strings_and_max_completion_tokens(main_server: LiveServer) -> None:
    client = main_server.client()
    counted = client.chat.completions.create(
        model="smol",
        messages=[{"role": "user", "content": "Count from 1 to 20, separated by commas."}],
        temperature=0,
        max_completion_tokens=30,
    )
    text = counted.choices[0].message.content or ""
    assert len(text) > 2
    stop = text[1:3]
    stopped = client.chat.completions.create(
        model="smol",
        messages=[{"role": "user", "content": "Count from 1 to 20, separated by commas."}],
        temperature=0,
        max_completion_tokens=30,
        stop=[stop],
    )
    assert stopped.choices[0].message.content == text[: text.index(stop)]
    assert stopped.choices[0].finish_reason == "stop"
    limited = client.chat.completions.create(
        model="smol",
        messages=[{"role": "user", "content": "Write a long story."}],
        temperature=0,
        max_tokens=3,
    )
    assert limited.usage is not None and limited.usage.completion_tokens == 3
    assert limited.choices[0].finish_reason == "length"


def test_request_over_the_context_size_is_context_length_exceeded(main_server: LiveServer) -> None:
    huge = "word " * 9000
    with pytest.raises(openai.BadRequestError) as info:
        main_server.client().chat.completions.create(
            model="smol", messages=[{"role": "user", "content": huge}], max_tokens=1
        )
    body = info.value.body
    assert isinstance(body, dict)
    assert body["code"] == "context_length_exceeded"
    assert "8192" in body["message"]


def test_ignore_eos_generates_past_the_end_of_turn(main_server: LiveServer) -> None:
    client = main_server.client()
    hello = [{"role": "user", "content": "Hi"}]
    natural = client.chat.completions.create(
        model="smol", messages=hello, max_tokens=16, temperature=0
    )
    assert natural.choices[0].finish_reason == "stop"
    assert natural.usage is not None and natural.usage.completion_tokens < 16
    forced = client.chat.completions.create(
        model="smol",
        messages=hello,
        max_tokens=16,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert forced.choices[0].finish_reason == "length"
    assert forced.usage is not None and forced.usage.completion_tokens == 16
    natural_text = natural.choices[0].message.content or ""
    forced_text = forced.choices[0].message.content or ""
    assert natural_text and forced_text.startswith(natural_text)
    assert len(forced_text) > len(natural_text)
