"""The chat page on a kvmem-server with the random-weight projector: /props reports
vision, so the attach button shows; an uploaded and a pasted image go to the server as
image_url data URIs and the server answers them (issue 12)."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from typing import Any

import pytest
from PIL import Image

from kvmem.bench.synth_mmproj import MmprojShape, write_mmproj
from tests.server.conftest import LiveServer, start_server
from tests.ui.conftest import SERVER_ARGS
from tests.ui.page_driver import Chat

pytestmark = pytest.mark.slow


def _png(color: tuple[int, int, int]) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (40, 30), color).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def vision_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("ui-vision")
    mmproj = write_mmproj(root / "mmproj.gguf", MmprojShape())
    server = start_server((*SERVER_ARGS, "-mm", str(mmproj)), root)
    yield server
    assert server.stop() == 0, server.log()[-3000:]


def _image_urls(body: dict[str, Any]) -> list[str]:
    content = body["messages"][-1]["content"]
    return [p["image_url"]["url"] for p in content if p["type"] == "image_url"]


def test_upload_and_paste_send_images(browser: Any, vision_server: LiveServer, tmp_path) -> None:
    chat = Chat(browser, vision_server)
    try:
        page = chat.page
        assert page.locator("#attach-label").is_visible()  # /props reports vision
        red = tmp_path / "red.png"
        red.write_bytes(_png((255, 0, 0)))
        page.set_input_files("#attach", str(red))
        page.wait_for_selector("#attachments img")
        chat.send("What is this?")
        assert _image_urls(chat.sent[-1]) == [
            "data:image/png;base64," + base64.b64encode(red.read_bytes()).decode()
        ]
        assert page.locator(".msg.user img").count() == 1
        assert page.locator(".meta .error").count() == 0
        assert page.locator("#attachments").is_hidden()  # cleared after sending
        # paste a second image into the prompt box
        blue = base64.b64encode(_png((0, 0, 255))).decode()
        page.evaluate(
            """(b64) => {
                 const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
                 const data = new DataTransfer();
                 data.items.add(new File([bytes], 'blue.png', { type: 'image/png' }));
                 const event = new ClipboardEvent('paste', { clipboardData: data });
                 document.getElementById('prompt').dispatchEvent(event);
               }""",
            blue,
        )
        page.wait_for_selector("#attachments img")
        chat.send("And this one?")
        assert _image_urls(chat.sent[-1]) == ["data:image/png;base64," + blue]
        assert page.locator(".msg.user img").count() == 2
        assert page.locator(".meta .error").count() == 0
        # the first turn, its image's 16 rows included, came from the server's cache
        assert chat.memory()["cached"] > MmprojShape().n_patches
    finally:
        chat.close()
