"""The chat page's issue-30 features in a real browser on a real kvmem-server whose KVMem
window (512 + 128) is far smaller than its context (4096): a chat that outgrows the window
shows blocks retrieved; a reply cut by the output cap is marked and Continue resumes it; a
conversation over the context is trimmed and goes on; code copies to the clipboard;
conversations export and import as JSON; the prompt-progress bar follows recorded
`prompt_progress` chunks, and moves during a real long paste on a server with a small `-b`.
Every request stays on 127.0.0.1 (the driver's route guard)."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.server.conftest import LiveServer, start_server
from tests.ui.conftest import DOCS_IMG
from tests.ui.page_driver import Chat

pytestmark = pytest.mark.slow
WINDOW_ARGS = ("-c", "4096", "--kvmem-budget", "512", "--kvmem-gen-reserve", "128")
WORDS = [
    "river",
    "stone",
    "lantern",
    "harbor",
    "copper",
    "meadow",
    "signal",
    "archive",
    "orbit",
    "timber",
    "quartz",
]
SHOT = {"width": 1100, "height": 720}


@pytest.fixture(scope="module")
def window_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    server = start_server((*WINDOW_ARGS, "-t", "2", "--seed", "7"), tmp_path_factory.mktemp("w"))
    yield server
    assert server.stop() == 0, server.log()[-3000:]


def filler(seed: int, n_sentences: int) -> str:
    rng = random.Random(seed)
    return " ".join(
        " ".join(rng.choice(WORDS) for _ in range(8)).capitalize() + "." for _ in range(n_sentences)
    )


def test_a_chat_over_the_window_shows_retrieval(browser: Any, window_server: LiveServer) -> None:
    chat = Chat(browser, window_server, cap=6, viewport=SHOT)
    page = chat.page
    assert page.locator(".greeting .server-what").text_content() == (
        "SmolLM2-135M-Instruct.Q4_1.gguf: context 4096 tokens, "
        "KVMem window 512 + 128 tokens on the GPU."
    )
    assert page.locator("#server-status").text_content() == "ctx 4096 \u00b7 KVMem window 512 + 128"
    assert page.locator("#kvmem-live").is_hidden()  # nothing over the window yet
    for part in range(3):
        chat.send(f"Part {part}: " + filler(part, 25))
    stored = chat.stored()[0]["messages"]
    replies = [m for m in stored if m["role"] == "assistant"]
    assert [m["usage"]["completion_tokens"] for m in replies] == [6, 6, 6]
    assert replies[-1]["usage"]["prompt_tokens"] > 640  # the chat outgrew the window
    blocks = sum(m["memory"]["retrieved_blocks"] for m in replies)
    assert blocks > 0
    live = page.locator("#kvmem-live")
    assert live.is_visible()
    assert live.get_attribute("data-retrieved-blocks") == str(blocks)
    assert int(live.get_attribute("data-retrieved")) == 128 * blocks > 0
    last = replies[-1]
    assert live.text_content() == (
        f"this chat: prompt {last['usage']['prompt_tokens']} / window 640 \u00b7 "
        f"retrieved {blocks} block{'' if blocks == 1 else 's'} ({128 * blocks} tokens)"
    )
    # each reply over the window says so on its memory line, with its own retrieved blocks
    views = page.locator(".msg.assistant")
    for i, m in enumerate(replies):
        window = views.nth(i).locator(".meta .window")
        if m["usage"]["prompt_tokens"] <= 640:
            assert window.count() == 0
            continue
        n = m["memory"]["retrieved_blocks"]
        assert window.text_content() == (
            f"KVMem: {m['usage']['prompt_tokens']}-token prompt over the 512 + 128 window "
            f"\u00b7 {n} block{'' if n == 1 else 's'} retrieved"
        )
        speed = views.nth(i).locator(".meta .prompt-speed").text_content()
        t = m["timings"]
        assert speed == f"prompt {t['prompt_n']} tokens at {t['prompt_per_second']:.1f} tok/s"
    page.screenshot(path=str(DOCS_IMG / "ui-kvmem-window.png"))
    chat.close()


def test_a_reply_cut_by_the_cap_is_marked_and_continue_resumes_it(
    browser: Any, window_server: LiveServer
) -> None:
    chat = Chat(browser, window_server, cap=8, viewport=SHOT)
    chat.rewrite = lambda body: {**body, "ignore_eos": True}  # the cap, not the model, ends it
    chat.send("Count from one to fifty, one number per line.")
    reply = chat.last_reply()
    assert reply.locator(".meta .cut").text_content() == "cut off at the 8-token cap"
    first = chat.stored()[0]["messages"][-1]
    assert first["finish"] == "length" and first["usage"]["completion_tokens"] == 8
    assert chat.sent[-1]["max_tokens"] == 8 and chat.sent[-1]["return_progress"] is True
    reply.locator(".meta .continue").click()
    chat.wait_reply()
    # the follow-up request continues the assistant message (prefill) ...
    assert [m["role"] for m in chat.sent[-1]["messages"]] == ["user", "assistant"]
    assert chat.sent[-1]["messages"][-1]["content"] == first["content"]
    # ... and the reply grows in place: one assistant message, 16 tokens, cut again
    resumed = chat.stored()[0]["messages"]
    assert [m["role"] for m in resumed] == ["user", "assistant"]
    assert resumed[-1]["content"].startswith(first["content"])
    assert len(resumed[-1]["content"]) > len(first["content"])
    assert resumed[-1]["usage"]["completion_tokens"] == 16
    assert reply.locator(".meta .tokens").text_content() == "16 tokens"
    assert reply.locator(".meta .continue").count() == 1
    chat.page.screenshot(path=str(DOCS_IMG / "ui-continue.png"))
    chat.close()


def test_a_conversation_over_the_context_is_trimmed_and_goes_on(
    browser: Any, window_server: LiveServer
) -> None:
    chat = Chat(browser, window_server, cap=4, viewport=SHOT)
    long_turns = []
    for part in range(3):
        long_turns += [
            {"role": "user", "content": f"Log {part}: " + filler(10 + part, 180)},
            {"role": "assistant", "content": f"Noted log {part}."},
        ]
    chat.store({"id": "long", "title": "Long logs", "updated": 9, "messages": long_turns})
    chat.send("Which words did the logs use?")
    note = chat.last_reply().locator(".context-full")
    text = note.locator(".text").text_content()
    assert text.startswith("This conversation has reached the context (")
    assert text.endswith(
        " tokens > 4096). Trim the oldest turns to go on: they stay here but are no longer sent."
    )
    asked = int(text.split("(")[1].split(" ")[0])
    assert asked > 4096
    chat.page.screenshot(path=str(DOCS_IMG / "ui-context-full.png"))
    note.locator(".trim").click()
    chat.wait_reply()
    sent = chat.sent[-1]["messages"]
    assert sent[-1] == {"role": "user", "content": "Which words did the logs use?"}
    assert sent[0]["role"] == "user" and len(sent) < len(long_turns) + 1
    stored = chat.stored()[0]
    trimmed = len(long_turns) + 1 - len(sent)
    assert stored["sentFrom"] == trimmed
    assert chat.page.locator(".msg.trimmed").count() == trimmed
    assert chat.page.locator(".trim-divider").text_content() == (
        f"{trimmed} earlier messages are no longer sent (trimmed to fit the context)"
    )
    last = stored["messages"][-1]
    assert "error" not in last and last["usage"]["completion_tokens"] > 0
    assert chat.last_reply().locator(".context-full").count() == 0

    # a message larger than the context by itself goes back to the box for editing
    chat.page.click("#new-chat")
    chat.page.wait_for_selector("#messages .greeting")  # the new chat is drawn before sending
    huge = "Read this: " + filler(20, 500)
    chat.send(huge)
    note = chat.last_reply().locator(".context-full")
    text = note.locator(".text").text_content()
    assert text.startswith("The last message alone is larger than the context (")
    assert text.endswith(" tokens > 4096). Shorten it to go on.")
    note.locator(".edit").click()
    assert chat.page.input_value("#prompt") == huge
    assert chat.page.locator(".msg").count() == 0 and chat.page.locator(".greeting").count() == 1
    chat.close()


SEEDED = {
    "id": "code",
    "title": "Code demo",
    "updated": 3,
    "messages": [
        {"role": "user", "content": "Two snippets, please:\n- **python**\n- shell"},
        {
            "role": "assistant",
            "content": "```python\ndef add(a, b):\n    return a + b\n```\n\n```\nls -la\n```",
        },
    ],
}


def test_code_copies_and_conversations_export_and_import(
    browser: Any, window_server: LiveServer, tmp_path: Path
) -> None:
    chat = Chat(browser, window_server, viewport=SHOT, accept_downloads=True)
    chat.context.grant_permissions(["clipboard-read", "clipboard-write"])
    page = chat.page
    chat.store(SEEDED)
    user = page.locator(".msg.user .body")  # Markdown in the user's message
    assert user.locator("li strong").text_content() == "python"
    assert user.locator("li").all_text_contents() == ["python", "shell"]
    heads = chat.last_reply().locator(".code-head")
    assert heads.count() == 2
    assert heads.nth(0).locator(".code-lang").text_content() == "python"
    assert heads.nth(1).locator(".code-lang").text_content() == "bash"  # detected
    heads.nth(0).locator(".copy").click()
    page.wait_for_function(
        "() => document.querySelector('.code-head .copy').textContent === 'Copied'"
    )
    assert (
        page.evaluate("() => navigator.clipboard.readText()") == "def add(a, b):\n    return a + b"
    )

    with page.expect_download() as download:
        page.click("#export")
    path = tmp_path / "export.json"
    download.value.save_as(path)
    assert download.value.suggested_filename == "kvmem-conversations.json"
    exported = json.loads(path.read_text())
    assert exported["format"] == "kvmem-chat" and exported["version"] == 1
    assert exported["conversations"] == chat.stored()
    page.click("#conversations li[data-id='code'] .delete")
    assert chat.stored() == []
    page.set_input_files("#import", str(path))
    page.wait_for_selector("#conversations li[data-id='code'].active")
    assert chat.stored() == exported["conversations"]
    assert page.locator(".msg").count() == 2

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "kvmem-chat", "conversations": [{"messages": [{}]}]}))
    page.set_input_files("#import", str(bad))
    page.wait_for_selector("#banner:not([hidden])")
    assert page.locator("#banner").text_content() == (
        "Import failed: bad.json: conversation 1, message 1: needs a role "
        "(system, user, assistant) and content"
    )
    assert chat.stored() == exported["conversations"]
    chat.close()


# Chunks as llama-server streams them with return_progress: processed counts the cache too.
RECORDED_PROGRESS = [
    {"total": 3900, "cache": 100, "processed": 100, "time_ms": 0},
    {"total": 3900, "cache": 100, "processed": 1124, "time_ms": 4000},
    {"total": 3900, "cache": 100, "processed": 3900, "time_ms": 15200},
]


def test_the_progress_bar_follows_recorded_prompt_progress(
    browser: Any, window_server: LiveServer
) -> None:
    chat = Chat(browser, window_server)
    seen = chat.page.evaluate(
        """(chunks) => {
             const { view, update, finish } = window.kvmemProgress;
             const box = view();
             document.body.append(box);
             const out = [];
             for (const p of chunks) {
               update(box, p);
               const bar = box.querySelector('progress');
               out.push([bar.value, bar.max, box.querySelector('.progress-label').textContent, box.hidden]);
             }
             finish(box);
             out.push(box.hidden);
             return out;
           }""",
        RECORDED_PROGRESS,
    )
    assert seen == [
        [0, 3800, "prompt 0 / 3800 tokens (100 cached)", False],
        [1024, 3800, "prompt 1024 / 3800 tokens (100 cached) \u00b7 256.0 tok/s", False],
        [3800, 3800, "prompt 3800 / 3800 tokens (100 cached) \u00b7 250.0 tok/s", False],
        True,
    ]
    chat.close()


# Every change of a reply's progress bar, as the page draws it (progress.js sets data-done on
# each update): the old values of the attribute records and the value at each callback, with
# whether the reply's text had started yet.
WATCH_PROGRESS = """() => {
  window.seenProgress = [];
  const note = (box, done) => window.seenProgress.push({
    done: Number(done), todo: Number(box.dataset.todo), hidden: box.hidden,
    label: box.querySelector('.progress-label').textContent,
    replyStarted: box.closest('.msg').querySelector('.body').textContent !== '',
  });
  new MutationObserver((records) => {
    for (const r of records) {
      if (r.oldValue !== null) note(r.target, r.oldValue);
      note(r.target, r.target.dataset.done);
    }
  }).observe(document.getElementById('messages'),
             { subtree: true, attributeFilter: ['data-done'], attributeOldValue: true });
}"""
PASTE_BATCH = 32  # -b/-ub of the paste test's server: a ~270-token paste is ~8 prefill chunks


@pytest.fixture()
def small_batch_server(tmp_path: Path) -> Iterator[LiveServer]:
    batch = str(PASTE_BATCH)
    server = start_server(("-c", "2048", "-b", batch, "-ub", batch, "-t", "2"), tmp_path)
    yield server
    assert server.stop() == 0, server.log()[-3000:]


def test_a_long_paste_shows_the_progress_bar_moving(
    browser: Any, small_batch_server: LiveServer
) -> None:
    chat = Chat(browser, small_batch_server, cap=2)
    chat.page.evaluate(WATCH_PROGRESS)
    chat.send("Summarise: " + filler(40, 25))
    assert chat.sent[-1]["return_progress"] is True
    seen = chat.page.evaluate("() => window.seenProgress")
    before_reply = [s for s in seen if not s["replyStarted"]]
    values = [s["done"] for s in before_reply]
    assert len(set(values)) >= 2, seen  # the bar moved while the prompt was processed
    assert values == sorted(values)
    assert all(not s["hidden"] for s in before_reply)
    assert all(s["label"].startswith("prompt ") for s in before_reply)
    prompt_tokens = chat.stored()[0]["messages"][-1]["usage"]["prompt_tokens"]
    assert {s["todo"] for s in seen} == {prompt_tokens}  # a fresh server: nothing cached
    assert values[-1] == prompt_tokens
    assert " tok/s" in before_reply[-1]["label"]
    assert chat.last_reply().locator(".prompt-progress").is_hidden()  # gone once the reply came
    chat.close()
