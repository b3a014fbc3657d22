"""OpenAI message validation and normalization."""

from __future__ import annotations

import base64

import pytest

from kvmem.chat.messages import last_user_index, normalize_messages
from kvmem.errors import InvalidRequestError

PNG = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\nfake").decode()


def test_normalization() -> None:
    msgs = normalize_messages(
        [
            {"role": "developer", "content": "Be brief."},
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                "name": "ann",
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "f", "arguments": '{"x": [1]}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "ok"},
            {"role": "assistant", "content": "done", "reasoning_content": "thought"},
        ]
    )
    assert msgs == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "a\nb", "name": "ann"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "f", "arguments": {"x": [1]}}, "id": "c1"}
            ],
        },
        {"role": "tool", "content": "ok", "tool_call_id": "c1"},
        {"role": "assistant", "content": "done", "reasoning_content": "thought"},
    ]
    assert last_user_index(msgs) == 1
    assert last_user_index([{"role": "system", "content": "s"}]) is None


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ("hello", "messages"),
        ([], "messages"),
        (["hi"], "messages[0]"),
        ([{"content": "x"}], "messages[0].role"),
        ([{"role": "wizard", "content": "x"}], "messages[0].role"),
        ([{"role": "user"}], "messages[0].content"),
        ([{"role": "user", "content": 42}], "messages[0].content"),
        ([{"role": "user", "content": [{"type": "audio"}]}], "messages[0].content[0].type"),
        (
            [{"role": "user", "content": [{"type": "text", "text": 1}]}],
            "messages[0].content[0].text",
        ),
        (
            [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
            "messages[0].content[0].image_url",
        ),
        (
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}
                    ],
                }
            ],
            "messages[0].content[0].image_url",
        ),
        (
            [
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}],
                }
            ],
            "messages[0].content[0].image_url",
        ),
        (
            [
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}],
                }
            ],
            "messages[0].content[0].image_url",
        ),
        (
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": PNG}}]}],
            "messages[0].content[0]",
        ),
        (
            [
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"function": {"name": "f", "arguments": "{"}}],
                }
            ],
            "messages[0].tool_calls[0].function.arguments",
        ),
        (
            [
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"function": {"arguments": "{}"}}],
                }
            ],
            "messages[0].tool_calls[0].function",
        ),
        ([{"role": "tool", "content": "x", "tool_call_id": 5}], "messages[0].tool_call_id"),
    ],
)
def test_invalid_messages_name_the_field(messages: object, param: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        normalize_messages(messages)
    assert info.value.param == param
