"""The chat page in a real browser (Debian's chromium via Playwright) on a real kvmem-server.

Each test gets a fresh browser context (empty IndexedDB and localStorage). The servers run
the embedded SmolLM2-135M-Instruct; replies are short except where a test asks for a long
one (it then adds `ignore_eos` to the page's request on its way out).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

import kvmem
from tests.server.conftest import LiveServer
from tests.ui.conftest import DOCS_IMG, UI_KEY
from tests.ui.page_driver import REPLY_CAP, REPLY_TIMEOUT_MS, Chat

pytestmark = pytest.mark.slow

SEEDED = {
    "id": "seeded",
    "title": "Markdown demo",
    "updated": 1,
    "messages": [
        {"role": "user", "content": "Show me a Python function and a table."},
        {
            "role": "assistant",
            "reasoning": "The user wants code and a table; keep it short.",
            "content": (
                "Here is **a function**:\n\n```python\ndef add(a: int, b: int) -> int:\n"
                "    return a + b\n```\n\n| tier | holds |\n| --- | --- |\n| GPU | the window |\n"
                "| host | every block |\n\nInline `code` and a [link](#top)."
            ),
            "speed": 152.3,
            "usage": {"completion_tokens": 61},
            "memory": {"cached_tokens": 412, "reprocessed_tokens": 18, "retrieved_tokens": 256},
        },
    ],
}


@pytest.fixture()
def chat(browser: Any, ui_server: LiveServer) -> Iterator[Chat]:
    c = Chat(browser, ui_server)
    yield c
    c.close()


def test_streamed_answer_renders_and_stop_ends_generation_on_the_server(
    chat: Chat, ui_server: LiveServer
) -> None:
    page = chat.page
    assert page.title() == "KVMem chat"
    assert page.locator("#attach-label").is_hidden()  # /props reports no vision
    assert page.locator("#model-name").text_content() == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert (
        page.locator("#server-status").text_content() == "ctx 4096 \u00b7 KVMem window 1024 + 512"
    )

    chat.rewrite = lambda body: {**body, "ignore_eos": True, "max_tokens": 3000}
    log_before = ui_server.log().count("finish cancelled")
    chat.send("Tell me a long story about a dragon.", wait=False)
    # the answer renders while it streams: text is on the page and Stop is still offered
    page.wait_for_function(
        "() => { const b = document.querySelector('.msg.assistant .body');"
        " return b !== null && b.textContent.length > 40 && !document.getElementById('stop').hidden; }",
        timeout=REPLY_TIMEOUT_MS,
    )
    page.click("#stop")
    chat.wait_reply()
    assert chat.last_reply().locator(".meta .stopped").text_content() == "stopped"
    deadline = time.monotonic() + 120
    while ui_server.log().count("finish cancelled") == log_before:
        assert time.monotonic() < deadline, "the server kept generating after Stop"
        time.sleep(0.2)
    chat.rewrite = lambda body: body

    chat.send("Hi")
    reply = chat.last_reply()
    assert reply.locator(".body").text_content().strip() != ""
    stored = chat.stored()[0]["messages"][-1]  # what the page kept from the stream
    speed = stored["timings"]["predicted_per_second"]
    assert speed > 0 and stored["speed"] == speed  # the server-measured decode speed
    assert reply.locator(".meta .speed").text_content() == f"{speed:.1f} tok/s"
    assert (
        stored["memory"]["cached_tokens"]
        == stored["usage"]["prompt_tokens_details"]["cached_tokens"]
    )
    assert chat.memory() == {
        k.removesuffix("_tokens"): stored["memory"][k]
        for k in ("cached_tokens", "reprocessed_tokens", "retrieved_tokens")
    }
    sent = chat.chat_requests()
    assert [m["role"] for m in sent[-1]["messages"]] == ["user", "assistant", "user"]
    assert sent[-1]["stream"] is True and sent[-1]["return_progress"] is True
    assert sent[-1]["max_tokens"] == REPLY_CAP  # the page's output cap


def test_conversations_switch_continue_rename_delete(chat: Chat) -> None:
    page = chat.page
    chat.send("Hi, I am Ann.")
    first_id = page.locator("#conversations li.active").get_attribute("data-id")
    page.click("#new-chat")
    page.wait_for_function("() => document.querySelectorAll('.msg').length === 0")
    chat.send("What is two plus two?")
    assert page.locator("#conversations li").count() == 2
    page.click(f"#conversations li[data-id='{first_id}'] .title")
    assert page.locator(".msg.user .body").first.text_content() == "Hi, I am Ann."
    chat.send("What is my name?")
    switched = chat.memory()
    assert switched["cached"] > 0  # the shared template prefix survives the switch
    prompt_after_switch = chat.chat_requests()[-1]["messages"]
    assert [m["content"] for m in prompt_after_switch if m["role"] == "user"] == [
        "Hi, I am Ann.",
        "What is my name?",
    ]
    chat.send("Thanks.")
    continued = chat.memory()
    # continuing the same conversation reuses the whole previous prompt and reply
    assert continued["cached"] > switched["cached"] + switched["reprocessed"] - 4
    assert continued["reprocessed"] < continued["cached"]

    page.click(f"#conversations li[data-id='{first_id}'] .rename")
    page.fill("#conversations .title-input", "Ann's chat")
    page.press("#conversations .title-input", "Enter")
    # the list shows the new title once IndexedDB's transaction is complete
    page.locator("#conversations .title", has_text="Ann's chat").wait_for()
    chat.open()  # reload: everything comes back from IndexedDB
    titles = page.locator("#conversations .title").all_text_contents()
    assert sorted(titles) == sorted(["Ann's chat", "What is two plus two?"])
    assert page.locator(".msg.user").count() == 3  # the most recent conversation is shown
    other = page.locator("#conversations li:not(.active)").get_attribute("data-id")
    page.click(f"#conversations li[data-id='{other}'] .delete")
    chat.open()
    assert page.locator("#conversations .title").all_text_contents() == ["Ann's chat"]


def test_settings_are_sent_with_the_request(chat: Chat) -> None:
    page = chat.page
    page.click("#open-settings")
    assert page.locator("#set-temperature").is_disabled()
    page.uncheck("#set-follow")
    page.select_option("#set-thinking", "off")
    page.select_option("#set-effort", "low")
    for field, value in {
        "#set-budget": "64",
        "#set-max-tokens": "5",
        "#set-temperature": "0.5",
        "#set-top-p": "0.9",
        "#set-top-k": "20",
        "#set-min-p": "0.1",
    }.items():
        page.fill(field, value)
    page.click("#settings-save")
    chat.send("Count from one to twenty.")
    sent = chat.chat_requests()[-1]
    options = {
        k: v
        for k, v in sent.items()
        if k not in ("messages", "stream", "stream_options", "return_progress")
    }
    assert options == {
        "chat_template_kwargs": {"enable_thinking": False},
        "reasoning_effort": "low",
        "reasoning_budget_tokens": 64,
        "max_tokens": 5,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 20,
        "min_p": 0.1,
    }
    assert chat.last_reply().locator(".meta .tokens").text_content() == "5 tokens"
    chat.open()  # settings persist in this browser
    page.click("#open-settings")
    assert page.input_value("#set-max-tokens") == "5"
    page.check("#set-follow")
    page.click("#settings-save")
    chat.send("Hi")
    last = chat.chat_requests()[-1]  # following the server: only the output cap is sent
    assert set(last) == {"messages", "stream", "stream_options", "return_progress", "max_tokens"}
    assert last["max_tokens"] == 5


def test_model_output_with_html_is_shown_as_text_and_never_runs(chat: Chat) -> None:
    page = chat.page
    payload = "<img src=x onerror=__xss=1>**b**<script>__xss=2</script>"

    # a grammar makes the real model emit exactly this JSON string
    forced = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"const": payload}}}
    chat.rewrite = lambda body: {**body, "response_format": forced, "max_tokens": 64}
    chat.send("Say something.")
    body = chat.last_reply().locator(".body")
    assert body.text_content().strip() == json.dumps(payload).replace("**b**", "b")
    assert body.locator("img").count() == 0 and body.locator("script").count() == 0
    assert body.locator("strong").text_content() == "b"  # Markdown still renders
    assert page.evaluate("() => window.__xss") is None
    chat.open()  # and again when the stored reply is rendered from history
    assert chat.last_reply().locator(".body img, .body script").count() == 0
    assert page.evaluate("() => window.__xss") is None


def test_history_renders_markdown_code_and_collapsible_thinking_and_screenshots(
    browser: Any, ui_server: LiveServer
) -> None:
    for name, viewport in (("desktop", (1280, 800)), ("phone", (390, 844))):
        chat = Chat(browser, ui_server, viewport={"width": viewport[0], "height": viewport[1]})
        page = chat.page
        chat.store(SEEDED)
        reply = chat.last_reply()
        assert reply.locator(
            "pre code.hljs.language-python .hljs-keyword"
        ).first.text_content() == ("def")
        assert reply.locator("table td").all_text_contents() == [
            "GPU",
            "the window",
            "host",
            "every block",
        ]
        thinking = reply.locator("details.thinking")
        assert thinking.get_attribute("open") is None
        assert thinking.locator(".thinking-body").is_hidden()
        thinking.locator("summary").click()
        assert (
            thinking.locator(".thinking-body").text_content() == SEEDED["messages"][1]["reasoning"]
        )
        assert reply.locator(".meta .memory").text_content() == (
            "memory: 412 cached \u00b7 18 reprocessed \u00b7 256 retrieved"
        )
        assert reply.locator(".meta .speed").text_content() == "152.3 tok/s"
        chat.send("Thanks!")
        assert chat.memory()["cached"] >= 0
        page.screenshot(path=str(DOCS_IMG / f"ui-{name}.png"))
        chat.close()


def test_api_key_page_loads_api_refuses_until_the_key_is_entered(
    browser: Any, ui_auth_server: LiveServer
) -> None:
    chat = Chat(browser, ui_auth_server)
    page = chat.page
    assert page.locator("#banner").text_content() == (
        "This server needs an API key: enter it in Settings."
    )
    assert page.locator("#server-status").text_content() == "API key needed"
    chat.send("Hi")
    assert "API key" in chat.last_reply().locator(".meta .error").text_content()
    page.click("#open-settings")
    page.fill("#set-api-key", UI_KEY)
    page.click("#settings-save")
    page.wait_for_function("() => document.getElementById('banner').hidden")
    chat.send("Hi")
    reply = chat.last_reply()
    assert reply.locator(".meta .error").count() == 0
    assert reply.locator(".body").text_content().strip() != ""
    assert page.evaluate("() => localStorage.getItem('kvmem.apiKey')") == UI_KEY
    auths = [r.headers.get("authorization") for r in chat.requests if "/v1/" in r.url]
    assert auths[-1] == f"Bearer {UI_KEY}" and auths[0] is None
    assert all(UI_KEY not in r.url for r in chat.requests)
    chat.close()


def test_sw_js_removes_an_earlier_pages_worker_and_caches(
    browser: Any, ui_auth_server: LiveServer
) -> None:
    """A worker an earlier page registered at /sw.js (llama-server's UI does) is replaced by
    ours, which deletes the caches and unregisters itself; the page links its manifest and
    loads without a console error, all without the API key."""
    context = browser.new_context()
    page = context.new_page()
    console: list[str] = []
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
    page.goto(ui_auth_server.base_url + "/")
    page.evaluate(
        """async () => {
            const old = await caches.open('earlier-ui');
            await old.put('/index.html', new Response('an earlier page'));
            await navigator.serviceWorker.register('/sw.js');
        }"""
    )
    page.wait_for_function(
        "async () => (await navigator.serviceWorker.getRegistrations()).length === 0"
        " && (await caches.keys()).length === 0",
        timeout=30_000,
    )
    assert page.title() == "KVMem chat"
    manifest = page.evaluate(
        "async () => (await fetch(document.querySelector('link[rel=manifest]').href)).json()"
    )
    assert (manifest["name"], manifest["icons"][0]["src"]) == ("KVMem chat", "favicon.ico")
    version = page.evaluate("async () => (await fetch('/_app/version.json')).json()")
    assert version == {"version": kvmem.__version__}
    about_assets = [m for m in console if "manifest" in m.lower() or "worker" in m.lower()]
    assert about_assets == [], about_assets
    context.close()
