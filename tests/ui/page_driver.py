"""Drives the chat page in a real browser tab: sends messages, waits for replies, reads what
the page stored, and keeps every request on the server's own address (a route guard aborts
and records anything else)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from tests.server.conftest import LiveServer

REPLY_CAP = 16  # the page's output cap in these tests: short replies on a busy CPU
REPLY_TIMEOUT_MS = 300_000  # generous: other processes may share the two cores

LAST_REPLY_DONE = """(n) => {
  const all = document.querySelectorAll('.msg.assistant');
  const last = all[all.length - 1];
  return all.length >= n && document.getElementById('stop').hidden
    && last.querySelector('.meta').children.length > 0;
}"""

# Until a test's page changes it, the page's settings hold the output cap REPLY_CAP.
INITIAL_SETTINGS = """(cap) => {
  if (localStorage.getItem('kvmem.settings') === null) {
    localStorage.setItem('kvmem.settings', JSON.stringify({ follow: true, max_tokens: cap }));
  }
}"""

STORE_CONVERSATION = """(conv) => new Promise((resolve, reject) => {
  const req = indexedDB.open('kvmem-chat', 1);
  req.onsuccess = () => {
    const tx = req.result.transaction('conversations', 'readwrite');
    tx.objectStore('conversations').put(conv);
    tx.oncomplete = resolve; tx.onerror = reject;
  };
})"""


class Chat:
    """One browser tab on the page, recording every request it makes."""

    def __init__(
        self, browser: Any, server: LiveServer, cap: int = REPLY_CAP, **context: Any
    ) -> None:
        self.server = server
        self.context = browser.new_context(**context)
        self.context.add_init_script(f"({INITIAL_SETTINGS})({json.dumps(cap)})")
        self.foreign: list[str] = []
        self.context.route("**/*", self._guard)
        self.page = self.context.new_page()
        self.requests: list[Any] = []
        self.page.on("request", lambda r: self.requests.append(r))
        self.errors: list[str] = []
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.sent: list[dict[str, Any]] = []
        self.rewrite: Callable[[dict[str, Any]], dict[str, Any]] = lambda body: body
        self.page.route("**/v1/chat/completions", self._on_chat_request)
        self.open()

    def _guard(self, route: Any, request: Any) -> None:
        """No request leaves the server's address: anything else is aborted and recorded."""
        if request.url.startswith(self.server.base_url + "/"):
            route.continue_()
        else:
            self.foreign.append(request.url)
            route.abort()

    def _on_chat_request(self, route: Any, request: Any) -> None:
        """Record the page's request body, then send it on, rewritten by `self.rewrite`."""
        body = json.loads(request.post_data)
        self.sent.append(body)
        route.continue_(post_data=json.dumps(self.rewrite(dict(body))))

    def open(self) -> None:
        self.page.goto(self.server.base_url + "/")
        self.page.wait_for_selector("body[data-ready='1']")

    def store(self, conversation: dict[str, Any]) -> None:
        """Put a conversation into the page's IndexedDB and reload the page."""
        self.page.evaluate(STORE_CONVERSATION, conversation)
        self.open()

    def send(self, text: str, wait: bool = True) -> None:
        self.expected = self.page.locator(".msg.assistant").count() + 1
        self.page.fill("#prompt", text)
        self.page.press("#prompt", "Enter")
        if wait:
            self.wait_reply()

    def wait_reply(self) -> None:
        """Until the reply to the last send is complete (its meta line is written)."""
        try:
            self.page.wait_for_function(
                LAST_REPLY_DONE, arg=self.expected, timeout=REPLY_TIMEOUT_MS
            )
        except Exception:
            print("page errors:", self.errors)
            print("messages:", self.page.locator("#messages").inner_html()[-3000:])
            print("sent:", self.sent[-2:])
            raise

    def last_reply(self) -> Any:
        return self.page.locator(".msg.assistant").last

    def memory(self) -> dict[str, int]:
        data = self.last_reply().locator(".meta").evaluate("m => ({...m.dataset})")
        return {k: int(v) for k, v in data.items() if k in ("cached", "reprocessed", "retrieved")}

    def stored(self) -> list[dict[str, Any]]:
        """The conversations in the page's IndexedDB."""
        return self.page.evaluate(
            """() => new Promise((resolve) => {
                 const req = indexedDB.open('kvmem-chat', 1);
                 req.onsuccess = () => {
                   const all = req.result.transaction('conversations').objectStore('conversations').getAll();
                   all.onsuccess = () => resolve(all.result);
                 };
               })"""
        )

    def chat_requests(self) -> list[dict[str, Any]]:
        return self.sent

    def close(self) -> None:
        foreign = [r.url for r in self.requests if not r.url.startswith(self.server.base_url)]
        self.context.close()
        assert self.foreign == [] and foreign == [], "the page asked for something off the server"
        assert self.errors == [], "the page raised errors"
