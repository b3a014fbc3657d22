"""The `kvmem` object a request may carry: KVMem's own options, next to the API's fields.

`{"kvmem": {"conversation_id": "c-1"}}` runs the request on the client's conversation of
that id (engine/persist/conversation_ids.py), accepted by chat completions, /completion,
/v1/completions, Anthropic Messages and Responses. An unknown key inside it is a 400.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

CONVERSATION_ID = r"^[A-Za-z0-9_.:-]{1,128}$"  # also a URL path segment as it is


class KVMemOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    conversation_id: str | None = Field(default=None, pattern=CONVERSATION_ID)


def conversation_of(options: KVMemOptions | None) -> str | None:
    return options.conversation_id if options is not None else None


def kvmem_field(options: KVMemOptions | None) -> dict[str, Any]:
    """The `kvmem` entry of a chat request translated from another API ({} without one)."""
    return {"kvmem": options.model_dump(exclude_none=True)} if options is not None else {}
