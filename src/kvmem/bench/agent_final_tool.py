"""`kvmem-bench agent --final tool`: the memory question arrives as a tool result.

After an episode's history the user gives one task (fill in a profile form from what the
assistant knows about them); the agent opens the form and asks for the next field, and
the field's question comes back as a tool result: the final message. The reply starts
with the `fill_field` call up to the value:

    <tool_call>
    {"name": "fill_field", "arguments": {"field": "dog_name", "value": "

So the last user message is the task at the start of the loop, which names no fact, and
the fact sits far back in the history (in a user turn or an early tool result).
"""

from __future__ import annotations

import json
from typing import Any

from kvmem.bench.agent_data import Question
from kvmem.bench.conversation import Message, Role, ToolCall
from kvmem.bench.needle_agent import call_text

TASK = (
    "Please fill in my profile form for the new assistant app, using what you know about "
    "me from our conversations. Use the form tools."
)


def _tool(name: str, description: str, **params: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {k: {"type": "string", "description": v} for k, v in params.items()},
                "required": list(params),
            },
        },
    }


TOOLS: list[dict[str, Any]] = [
    _tool("open_form", "Open one of the user's forms.", form="the form's name"),
    _tool("next_field", "The next empty field of an open form.", form="the form's name"),
    _tool(
        "fill_field",
        "Fill in a field of the open form.",
        field="the field's name",
        value="the value",
    ),
]


def _round(call_id: str, name: str, arguments: dict[str, str], result: str) -> list[Message]:
    call = ToolCall(id=call_id, name=name, arguments=json.dumps(arguments))
    return [
        Message(Role.ASSISTANT, "", tool_calls=(call,)),
        Message(Role.TOOL, result, tool_call_id=call_id),
    ]


def final_tool_messages(question: Question) -> tuple[list[Message], str]:
    """The messages that follow the history for `question`, and the answer prefix."""
    form = {"form": "profile"}
    opened = json.dumps({"form": "profile", "status": "open", "empty_fields": 7})
    field = json.dumps({"field": question.form_field, "question": question.form_label})
    messages = [
        Message(Role.USER, TASK),
        *_round("form_0", "open_form", form, opened),
        *_round("form_1", "next_field", form, field),
    ]
    placeholder = "@VALUE@"
    call = call_text("fill_field", {"field": question.form_field, "value": placeholder})
    return messages, call.split(placeholder)[0]
