"""The chat page as the server serves it, and the per-turn `kvmem` object it displays."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

import kvmem
from kvmem.cli.api_keys import ApiKeys
from kvmem.cli.server_config import load_server_settings
from kvmem.errors import ConfigError
from kvmem.server.app import create_app
from kvmem.server.ui_files import PACKAGED_UI
from tests.fakes.app import USER, settings, sse_events, wait_ready
from tests.fakes.engine import FakeEngine

PAGE_FILES = (
    "index.html",
    "app.js",
    "settings.js",
    "conversations.js",
    "sse.js",
    "markdown.js",
    "progress.js",
    "transfer.js",
    "views.js",
    "style.css",
    "vendor.js",
    "hljs-light.css",
    "hljs-dark.css",
    "favicon.ico",
    "manifest.webmanifest",
    "sw.js",
)


def test_the_packaged_page_is_complete_and_references_only_its_own_files() -> None:
    for name in PAGE_FILES:
        assert (PACKAGED_UI / name).is_file(), name
    html = (PACKAGED_UI / "index.html").read_text()
    refs = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert sorted(refs) == sorted(
        [
            "manifest.webmanifest",
            "style.css",
            "hljs-light.css",
            "hljs-dark.css",
            "vendor.js",
            "settings.js",
            "conversations.js",
            "sse.js",
            "markdown.js",
            "progress.js",
            "transfer.js",
            "views.js",
            "app.js",
        ]
    )
    assert "connect-src 'self'" in html and "script-src 'self'" in html
    for name in PAGE_FILES:
        if not name.endswith((".js", ".css")) or name.startswith(("vendor", "hljs")):
            continue
        text = (PACKAGED_UI / name).read_text()
        assert not re.search(r"https?://", text), f"{name} names a network address"
        assert "@import" not in text and "url(" not in text


def test_page_is_public_while_the_api_needs_the_key() -> None:
    s = settings(api_keys=ApiKeys(("sk-a",)), ui=True)
    with TestClient(create_app(s, lambda _: FakeEngine())) as c:
        wait_ready(c)
        page = c.get("/")
        assert page.status_code == 200 and "<title>KVMem chat</title>" in page.text
        assert page.headers["content-type"].startswith("text/html")
        js = c.get("/app.js")
        assert js.status_code == 200 and "javascript" in js.headers["content-type"]
        assert js.text == (PACKAGED_UI / "app.js").read_text()
        assert c.get("/vendor.js").status_code == 200
        icon = c.get("/favicon.ico")  # what a browser asks for first: public, not a 404
        assert icon.status_code == 200 and icon.content[:4] == b"\x00\x00\x01\x00"
        assert icon.headers["content-type"] in ("image/x-icon", "image/vnd.microsoft.icon")
        assert c.get("/props").status_code == 401
        props = c.get("/props", headers={"Authorization": "Bearer sk-a"}).json()
        assert (props["webui"], props["webui_source"]) == (True, "packaged")


def test_llama_server_ui_assets_are_real_and_public() -> None:
    s = settings(api_keys=ApiKeys(("sk-a",)), ui=True)
    with TestClient(create_app(s, lambda _: FakeEngine())) as c:
        wait_ready(c)
        manifest = c.get("/manifest.webmanifest")
        assert manifest.status_code == 200
        assert manifest.headers["content-type"] == "application/manifest+json"
        body = manifest.json()
        assert (body["name"], body["start_url"], body["display"]) == (
            "KVMem chat",
            ".",
            "standalone",
        )
        assert [(i["src"], i["sizes"]) for i in body["icons"]] == [
            ("favicon.ico", "16x16 32x32 64x64")
        ]
        worker = c.get("/sw.js")
        assert worker.status_code == 200 and "javascript" in worker.headers["content-type"]
        assert "registration.unregister()" in worker.text and "caches.delete" in worker.text
        version = c.get("/_app/version.json")
        assert version.status_code == 200 and version.headers["cache-control"] == "no-cache"
        assert version.json() == {"version": kvmem.__version__}
        assert c.get("/_app/other.json").status_code == 404


def test_no_ui_serves_nothing_at_root_and_props_says_so() -> None:
    with TestClient(create_app(settings(ui=False), lambda _: FakeEngine())) as c:
        wait_ready(c)
        assert c.get("/").status_code == 404
        assert c.get("/app.js").status_code == 404
        assert c.get("/_app/version.json").status_code == 404
        props = c.get("/props").json()
        assert (props["webui"], props["webui_source"]) == (False, None)


def test_ui_dir_replaces_the_packaged_page(tmp_path: Path) -> None:
    (tmp_path / "index.html").write_text("<html>mine</html>")
    (tmp_path / "_app").mkdir()
    (tmp_path / "_app" / "version.json").write_text('{"version": "theirs"}')
    with TestClient(
        create_app(settings(ui=True, ui_dir=str(tmp_path)), lambda _: FakeEngine())
    ) as c:
        wait_ready(c)
        assert c.get("/").text == "<html>mine</html>"
        assert c.get("/app.js").status_code == 404
        assert c.get("/sw.js").status_code == 404
        assert c.get("/_app/version.json").json() == {"version": "theirs"}  # its own files
        assert c.get("/props").json()["webui_source"] == "--ui-dir"


@pytest.mark.parametrize("flag", ["--ui-dir", "--path"])
def test_ui_dir_without_index_html_is_a_config_error(tmp_path: Path, flag: str) -> None:
    (tmp_path / "page.html").write_text("<html></html>")
    with pytest.raises(ConfigError) as err:
        load_server_settings([flag, str(tmp_path)], {})
    assert str(err.value) == f"--ui-dir: {tmp_path} is not a directory holding index.html"


def test_ui_flags_and_environment_precedence(tmp_path: Path) -> None:
    (tmp_path / "index.html").write_text("x")
    load = load_server_settings
    assert load([], {})[0].ui is True
    assert load(["--no-ui"], {})[0].ui is False
    assert load(["--no-webui"], {})[0].ui is False
    assert load([], {"LLAMA_ARG_UI": "off"})[0].ui is False
    assert load(["--webui"], {"LLAMA_ARG_UI": "0"})[0].ui is True
    assert load(["--no-ui"], {"LLAMA_ARG_UI": "yes"})[0].ui is False
    assert load([], {"LLAMA_ARG_STATIC_PATH": str(tmp_path)})[0].ui_dir == str(tmp_path)
    with pytest.raises(ConfigError):
        load(["--ui"], {"LLAMA_ARG_UI": "maybe"})


class RetrievingEngine(FakeEngine):
    """A fake whose turns report KV-memory work, as the real session's TurnStats do."""

    def generate(self, prompt, **kw):  # type: ignore[no-untyped-def]
        gen = super().generate(prompt, **kw)
        first = True
        for token in gen:
            if first:
                t = self.last_turn
                t.replayed_tokens, t.stage_in_blocks, t.harvested_blocks = 3, 2, 1
                t.reselect_ms = 1.5
                first = False
            yield token


def test_kvmem_object_in_the_body_and_the_final_stream_chunk() -> None:
    engine = RetrievingEngine(replies=["Hello", "Again"])
    s = settings()
    with TestClient(create_app(s, lambda _: engine)) as c:
        wait_ready(c)
        body = c.post("/v1/chat/completions", json={"messages": USER}).json()
        n_prompt = body["usage"]["prompt_tokens"]
        assert body["kvmem"] == {
            "cached_tokens": 0,
            "reprocessed_tokens": n_prompt + 3,
            "retrieved_tokens": 2 * s.engine.kvmem.block_tokens,
            "prefill_tokens": n_prompt,
            "replayed_tokens": 3,
            "retrieved_blocks": 2,
            "stored_blocks": 1,
            "truncated_tokens": 0,
            "reselect_ms": 1.5,
        }
        again = [
            *USER,
            {"role": "assistant", "content": "Hello"},
            {"role": "user", "content": "Hi"},
        ]
        r = c.post("/v1/chat/completions", json={"messages": again, "stream": True})
        events = sse_events(r.text)
        final = [e for e in events if isinstance(e, dict) and e["choices"][0]["finish_reason"]]
        assert len(final) == 1
        memory = final[0]["kvmem"]
        assert memory["cached_tokens"] == n_prompt + len("Hello")
        assert memory["reprocessed_tokens"] == memory["prefill_tokens"] + 3
        assert final[0]["timings"]["cache_n"] == memory["cached_tokens"]
        assert [e for e in events if isinstance(e, dict) and "kvmem" in e] == final
