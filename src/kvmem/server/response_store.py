"""The server's memory of recent responses, for `previous_response_id` and
`GET /v1/responses/{id}`: in process, bounded by count and by stored text size, oldest
dropped first. Responses created with `store: false` are not kept."""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

MAX_RESPONSES = 256
MAX_CHARS = 64 * 1024 * 1024  # the conversations' JSON text, all responses together


@dataclass(slots=True)
class StoredResponse:
    body: dict[str, Any]  # the Response object as returned
    conversation: list[dict[str, Any]]  # chat messages up to and including this output
    chars: int = 0


class ResponseStore:
    __slots__ = ("_items", "_chars", "max_responses", "max_chars")

    def __init__(self, max_responses: int = MAX_RESPONSES, max_chars: int = MAX_CHARS) -> None:
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()
        self._chars = 0
        self.max_responses = max_responses
        self.max_chars = max_chars

    def __len__(self) -> int:
        return len(self._items)

    def get(self, response_id: str) -> StoredResponse | None:
        item = self._items.get(response_id)
        if item is not None:
            self._items.move_to_end(response_id)
        return item

    def put(self, body: dict[str, Any], conversation: list[dict[str, Any]]) -> None:
        chars = len(json.dumps(conversation, ensure_ascii=False)) + len(json.dumps(body))
        if chars > self.max_chars:
            logger.info("response %s is too large to keep (%d chars)", body["id"], chars)
            return
        self._items[body["id"]] = StoredResponse(body, conversation, chars)
        self._chars += chars
        while len(self._items) > self.max_responses or self._chars > self.max_chars:
            _, old = self._items.popitem(last=False)
            self._chars -= old.chars

    def delete(self, response_id: str) -> bool:
        item = self._items.pop(response_id, None)
        if item is None:
            return False
        self._chars -= item.chars
        return True
