"""Images through a real kvmem-server with the random-weight projector (issue 12): PNG,
JPEG, WebP and GIF data URIs and file:// URLs under --media-path; usage counts the image's
rows and the next turn finds them cached; every bad image is a 400 in the OpenAI envelope
that leaves the session as it was; --no-mmproj-offload runs too."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from PIL import Image

from kvmem.bench.synth_mmproj import MmprojShape, write_mmproj

from .conftest import LiveServer, start_server

pytestmark = pytest.mark.slow

ROWS = MmprojShape().n_patches  # 16 rows per image
ARGS = ("-c", "4096", "-t", "2", "--kvmem-budget", "2048", "--kvmem-gen-reserve", "256")


def _encoded(fmt: str, size: tuple[int, int] = (48, 40), seed: int = 0) -> bytes:
    img = Image.new("RGB", size)
    img.putdata(
        [((x * 7 + seed) % 256, (y * 5) % 256, 99) for y in range(size[1]) for x in range(size[0])]
    )
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


def _data_uri(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def _user(text: str, url: str) -> dict:
    return {
        "role": "user",
        "content": [
            {"type": "text", "text": text},
            {"type": "image_url", "image_url": {"url": url}},
        ],
    }


@pytest.fixture(scope="module")
def media(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("vision")
    (root / "media").mkdir()
    (root / "media" / "cat.png").write_bytes(_encoded("PNG", seed=3))
    (root / "outside.png").write_bytes(_encoded("PNG", seed=4))
    write_mmproj(root / "mmproj.gguf", MmprojShape())
    return root


@pytest.fixture(scope="module")
def server(media: Path, server_logs: Path) -> Iterator[LiveServer]:
    s = start_server(
        [*ARGS, "-mm", str(media / "mmproj.gguf"), "--media-path", str(media / "media")],
        server_logs,
    )
    yield s
    assert s.stop() == 0, s.log()[-3000:]


def _chat(server: LiveServer, messages: list[dict], max_tokens: int = 4) -> httpx.Response:
    body = {"model": "x", "messages": messages, "max_tokens": max_tokens, "temperature": 0}
    return server.http().post("/v1/chat/completions", json=body, timeout=300)


def test_props_report_vision(server: LiveServer) -> None:
    props = server.http().get("/props").json()
    assert props["modalities"] == {"vision": True, "audio": False}


def test_png_counts_rows_and_the_next_turn_has_them_cached(server: LiveServer) -> None:
    png = _data_uri(_encoded("PNG"))
    plain = _chat(server, [{"role": "user", "content": [{"type": "text", "text": "Hi there"}]}])
    assert plain.status_code == 200, plain.text
    first = _chat(server, [_user("Hi there", png)])
    assert first.status_code == 200, first.text
    n_plain = plain.json()["usage"]["prompt_tokens"]
    usage = first.json()["usage"]
    # the image adds its rows and the newline joining it to the text part
    assert usage["prompt_tokens"] == n_plain + ROWS + 1
    answer = first.json()["choices"][0]["message"]["content"]
    history = [_user("Hi there", png), {"role": "assistant", "content": answer}]
    second = _chat(server, [*history, {"role": "user", "content": "And now?"}])
    assert second.status_code == 200, second.text
    cached = second.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= usage["prompt_tokens"] - 1  # the image's rows among them


@pytest.mark.parametrize(
    "fmt,mime", [("JPEG", "image/jpeg"), ("WEBP", "image/webp"), ("GIF", "image/gif")]
)
def test_other_formats(server: LiveServer, fmt: str, mime: str) -> None:
    r = _chat(server, [_user("Look", _data_uri(_encoded(fmt, seed=9), mime))], max_tokens=1)
    assert r.status_code == 200, r.text


def test_file_url_under_media_path(server: LiveServer) -> None:
    r = _chat(server, [_user("Look", "file:///cat.png")], max_tokens=1)
    assert r.status_code == 200, r.text


def _huge_png() -> bytes:
    buf = io.BytesIO()
    Image.new("L", (5000, 4000)).save(buf, format="PNG")  # 20 Mpx, a few KB compressed
    return buf.getvalue()


BAD = [
    ("http", "http://example.com/cat.png", "remote image URLs are not fetched"),
    ("https", "https://example.com/cat.png", "remote image URLs are not fetched"),
    ("not-an-image", _data_uri(b"just some bytes" * 9), "is not a PNG, JPEG, WebP or GIF"),
    ("corrupt", _data_uri(b"\x89PNG\r\n\x1a\n" + b"\x00garbage" * 20), "data is corrupt"),
    ("truncated", _data_uri(_encoded("PNG")[:60]), "corrupt"),
    ("mime", _data_uri(_encoded("PNG"), "image/tiff"), "image type 'image/tiff' is not supported"),
    ("text-mime", _data_uri(b"hello", "text/plain"), "is not supported"),
    ("base64", "data:image/png;base64,@@@@", "invalid base64"),
    ("pixels", _data_uri(_huge_png()), "more than 16777216 pixels"),
    ("escape", "file:///../outside.png", "outside --media-path"),
    ("missing", "file:///nope.png", "no such file under --media-path"),
    ("scheme", "ftp://host/cat.png", "must be a data: URI or a file:// URL"),
]


@pytest.mark.parametrize("name,url,message", BAD, ids=[b[0] for b in BAD])
def test_bad_image_is_a_400_and_the_next_request_works(
    server: LiveServer, name: str, url: str, message: str
) -> None:
    r = _chat(server, [_user("Look", url)], max_tokens=1)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error"
    assert message in err["message"]
    assert err["param"] == "messages[0].content[1].image_url"
    ok = _chat(server, [_user("Look", _data_uri(_encoded("PNG", seed=1)))], max_tokens=1)
    assert ok.status_code == 200, ok.text


def test_no_mmproj_offload_runs(media: Path, server_logs: Path) -> None:
    s = start_server(
        [*ARGS, "--mmproj", str(media / "mmproj.gguf"), "--no-mmproj-offload"], server_logs
    )
    try:
        r = _chat(s, [_user("Look", _data_uri(_encoded("PNG")))], max_tokens=2)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] > ROWS
        # without --media-path a file:// URL is refused
        r = _chat(s, [_user("Look", "file:///cat.png")], max_tokens=1)
        assert r.status_code == 400 and "--media-path" in r.json()["error"]["message"]
    finally:
        assert s.stop() == 0, s.log()[-3000:]
