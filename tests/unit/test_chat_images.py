"""Image parts without a model: decoding and bounds, the per-request marker, and the
marker replaced by the image's items (and recorded as a group) when tokenizing."""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

from kvmem.chat.images import ImageCollector, ImageLimits, decode_image
from kvmem.chat.messages import normalize_messages
from kvmem.chat.prompt import render_prompt, tokenize_prompt
from kvmem.chat.template import ChatTemplate
from kvmem.errors import InvalidRequestError
from kvmem.memory.spans import TokenSpan
from tests.fakes.engine import FakeEngine

TEMPLATE = "{% for m in messages %}[{{ m.content }}]{% endfor %}"


class ImageEngine(FakeEngine):
    """Every image is three stand-in rows, distinct per content hash."""

    def __init__(self) -> None:
        super().__init__()
        self.slots: dict[str, int] = {}

    def image_items(self, digest: str, width: int, height: int, rgb: bytes) -> list[int]:
        assert len(rgb) == width * height * 3
        slot = self.slots.setdefault(digest, len(self.slots))
        return [-(1 + slot * 10 + r) for r in range(3)]


def _uri(fmt: str, color=(10, 20, 30), size=(6, 4), mime: str | None = None) -> str:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format=fmt)
    return (
        f"data:{mime or 'image/' + fmt.lower()};base64," + base64.b64encode(buf.getvalue()).decode()
    )


def _part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def _prompt(engine, messages, template=TEMPLATE):
    images = ImageCollector()
    normalized = normalize_messages(messages, vision=True, images=images)
    rendered = render_prompt(ChatTemplate(template), normalized)
    rendered.images, rendered.image_marker = tuple(images.images), images.marker
    return tokenize_prompt(engine, rendered)


def test_marker_becomes_the_rows_and_a_group() -> None:
    engine = ImageEngine()
    content = [{"type": "text", "text": "hi"}, _part(_uri("PNG")), _part(_uri("JPEG", (1, 2, 3)))]
    prompt = _prompt(engine, [{"role": "user", "content": content}])
    png, jpeg = [-1, -2, -3], [-11, -12, -13]
    assert prompt.tokens == [ord("["), ord("h"), ord("i"), 10, *png, 10, *jpeg, ord("]")]
    assert prompt.spans.groups == (TokenSpan(4, 7), TokenSpan(8, 11))
    assert prompt.query == TokenSpan(1, 11)


def test_the_same_image_twice_gets_the_same_rows_and_typed_markers_are_text() -> None:
    engine = ImageEngine()
    uri = _uri("WEBP")
    messages = [
        {"role": "user", "content": [_part(uri), {"type": "text", "text": "<__media__>"}]},
        {"role": "user", "content": [_part(uri)]},
    ]
    prompt = _prompt(engine, messages)
    assert prompt.tokens.count(-1) == 2 and len(engine.slots) == 1
    assert engine.detokenize([t for t in prompt.tokens if t >= 0]).count("<__media__>") == 1


def test_a_template_that_drops_an_image_is_refused() -> None:
    engine = ImageEngine()
    messages = [{"role": "user", "content": [_part(_uri("PNG"))]}]
    with pytest.raises(InvalidRequestError, match="placed 0 of the 1 images"):
        _prompt(engine, messages, "{% for m in messages %}<{{ m.role }}>{% endfor %}")


def test_gif_first_frame_and_bounds() -> None:
    frames = [Image.new("RGB", (4, 4), c) for c in ((255, 0, 0), (0, 0, 255))]
    buf = io.BytesIO()
    frames[0].save(buf, format="GIF", save_all=True, append_images=frames[1:])
    image = decode_image(buf.getvalue(), ImageLimits(), "p")
    assert (image.width, image.height) == (4, 4) and image.rgb[:3] == bytes([255, 0, 0])
    with pytest.raises(InvalidRequestError, match="more than 15 pixels"):
        decode_image(buf.getvalue(), ImageLimits(max_pixels=15), "p")
    with pytest.raises(InvalidRequestError, match="larger than 10 bytes"):
        decode_image(buf.getvalue(), ImageLimits(max_bytes=10), "p")
    same = decode_image(buf.getvalue(), ImageLimits(), "p")
    assert same.digest == image.digest


def test_without_a_projector_an_image_part_keeps_its_400() -> None:
    with pytest.raises(InvalidRequestError, match="no vision projector is loaded"):
        normalize_messages([{"role": "user", "content": [_part(_uri("PNG"))]}])
