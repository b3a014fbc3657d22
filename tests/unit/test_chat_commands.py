"""kvmem-cli -i's /save and /trace, the room kept for a reply and the bar rule, without a
model (the tmux test in tests/cli drives them on SmolLM2)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvmem.cli.chat_commands import reply_room, save_conversation, switch_trace, too_long
from kvmem.cli.progress_bar import LONG_PROMPT_TOKENS, PromptBar, wants_bar
from kvmem.engine.trace import PrefillProgress, Tracer


def _chat(template: object | None) -> SimpleNamespace:
    engine = SimpleNamespace(
        info=SimpleNamespace(path="/models/smol.gguf", n_ctx=4096),
        detokenize=lambda tokens: "".join(chr(t) for t in tokens),
    )
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "héllo"}]
    return SimpleNamespace(
        engine=engine, messages=messages, raw_history=[104, 105], template=template
    )


def test_reply_room_is_the_cap_at_most_a_quarter_of_the_context() -> None:
    assert [reply_room(4096, cap) for cap in (100, 5000, -1)] == [100, 1024, 1024]
    assert too_long(900, 512) == (
        "(the message takes 900 tokens, more than the 512-token context: not sent)"
    )


def test_save_writes_the_messages_or_the_raw_text(tmp_path: Path) -> None:
    path = tmp_path / "chat.json"
    assert save_conversation(_chat(object()), str(path)) == f"(saved 2 messages to {path})"
    assert json.loads(path.read_text(encoding="utf-8")) == {
        "model": "smol.gguf",
        "n_ctx": 4096,
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "héllo"}],
    }
    assert save_conversation(_chat(None), str(path)) == f"(saved the text to {path})"
    assert json.loads(path.read_text(encoding="utf-8"))["text"] == "hi"
    assert save_conversation(_chat(None), "") == "usage: /save FILE"
    missing = tmp_path / "no" / "such" / "dir.json"
    assert save_conversation(_chat(None), str(missing)) == (
        f"(not saved: No such file or directory: {missing})"
    )


def test_trace_switches_and_sets() -> None:
    tracer = Tracer(False)
    assert switch_trace(tracer, "") == "(KVMem trace on: KVMEM_* records on stderr)"
    assert tracer.enabled is True
    assert switch_trace(tracer, "") == "(KVMem trace off)" and tracer.enabled is False
    assert switch_trace(tracer, "on") == "(KVMem trace on: KVMEM_* records on stderr)"
    assert switch_trace(tracer, "on") == "(KVMem trace on: KVMEM_* records on stderr)"
    assert switch_trace(tracer, "maybe") == "usage: /trace [on|off]" and tracer.enabled is True


def test_bar_rule_and_a_short_prompt_draws_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert wants_bar(True) is True and wants_bar(False) is False
    assert wants_bar(None) is False  # pytest's captured stderr is not a terminal
    short = PromptBar(None)
    for done in (0, 64, LONG_PROMPT_TOKENS):
        short(PrefillProgress(LONG_PROMPT_TOKENS, 0, done))
    forced = PromptBar(True)
    for done in (10, 42, 74, 90, 74, 90):  # a replay after the end draws nothing more
        forced(PrefillProgress(90, 10, done))
    err = capsys.readouterr().err
    assert [int(n) for n in re.findall(r"\| (\d+)/80 ", err)] == [0, 32, 64, 80]
