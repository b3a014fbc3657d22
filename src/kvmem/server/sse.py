"""Server-sent events framing, shared by every streaming API.

OpenAI chat completions and llama-server's /completion stream unnamed `data:` events
(the OpenAI ones end with `data: [DONE]`); the Responses API and Anthropic Messages name
each event after its body's `type`.
"""

from __future__ import annotations

import json
from typing import Any

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
SSE_DONE = "data: [DONE]\n\n"


def sse_data(body: dict[str, Any]) -> str:
    """One unnamed event."""
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


def sse_event(body: dict[str, Any]) -> str:
    """One named event: the body's `type` is the event name."""
    return f"event: {body['type']}\ndata: {json.dumps(body, ensure_ascii=False)}\n\n"
