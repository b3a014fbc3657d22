"""kvmem-cli -i's commands that act on the chat (/save, /trace) and its context rules.

`/save FILE` writes the conversation as JSON: `{"model", "n_ctx", "messages"}` (chat
mode; the messages the next turn would send, after any trim) or `{"model", "n_ctx",
"text"}` (--raw: the history's text). `/trace` switches the KVMem trace; `/trace on` and
`/trace off` set it. `reply_room` is the room a chat keeps for a reply when it decides to
drop its oldest turns: the -n cap, at most a quarter of the context (a quarter without a
cap).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol


class _Chat(Protocol):
    engine: Any
    messages: list[dict[str, Any]]
    raw_history: list[int]
    template: Any


def reply_room(n_ctx: int, cap: int) -> int:
    quarter = n_ctx // 4
    return min(cap, quarter) if cap > 0 else quarter


def too_long(n_tokens: int, n_ctx: int) -> str:
    return f"(the message takes {n_tokens} tokens, more than the {n_ctx}-token context: not sent)"


def save_conversation(chat: _Chat, path: str) -> str:
    if not path:
        return "usage: /save FILE"
    info = chat.engine.info
    doc: dict[str, Any] = {"model": Path(info.path).name, "n_ctx": info.n_ctx}
    if chat.template is None:
        doc["text"] = chat.engine.detokenize(chat.raw_history)
    else:
        doc["messages"] = chat.messages
    try:
        Path(path).write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", "utf-8")
    except OSError as exc:
        return f"(not saved: {exc.strerror or exc}: {path})"
    what = "the text" if chat.template is None else f"{len(chat.messages)} messages"
    return f"(saved {what} to {path})"


def switch_trace(tracer: Any, arg: str) -> str:
    if arg not in ("", "on", "off"):
        return "usage: /trace [on|off]"
    tracer.enabled = (not tracer.enabled) if arg == "" else arg == "on"
    if tracer.enabled:
        return "(KVMem trace on: KVMEM_* records on stderr)"
    return "(KVMem trace off)"
