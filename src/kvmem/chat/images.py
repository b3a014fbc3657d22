"""Image parts of chat messages: fetched from a data: URI or a file:// URL under
--media-path (never from the network), bounded, decoded by Pillow to RGB and hashed.

Every problem is an `InvalidRequestError` naming the part, raised before the request
reaches the engine, so a bad image never leaves the session half-updated. The collector
puts a per-request marker where each image goes in the message text; `chat.prompt`
replaces the markers by the image's rows when it tokenizes the rendered prompt.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import os
import re
import secrets
import warnings
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlparse

from PIL import Image, UnidentifiedImageError

from kvmem.errors import InvalidRequestError

MIME_FORMATS = {
    "image/png": "PNG",
    "image/jpeg": "JPEG",
    "image/jpg": "JPEG",
    "image/webp": "WEBP",
    "image/gif": "GIF",
}
_FORMATS = sorted(set(MIME_FORMATS.values()))
_DATA_URI = re.compile(r"^data:([^;,]*)((?:;[^;,]*)*),(.*)$", re.S)


@dataclass(frozen=True, slots=True)
class ImageLimits:
    max_bytes: int = 20 << 20  # the encoded file
    max_pixels: int = 4096 * 4096  # width * height, checked before decoding


@dataclass(frozen=True, slots=True)
class PromptImage:
    digest: str  # SHA-256 of the size and the RGB pixels: identical images share it
    width: int
    height: int
    rgb: bytes  # row-major RGB, width * height * 3 bytes


@dataclass(slots=True)
class ImageCollector:
    """Decodes the image parts of one request, in order, and hands out their marker."""

    media_path: str | None = None
    limits: ImageLimits = field(default_factory=ImageLimits)
    marker: str = field(default_factory=lambda: f"<__kvmem_image_{secrets.token_hex(8)}__>")
    images: list[PromptImage] = field(default_factory=list)

    def add(self, image_url: Any, where: str) -> str:
        url = image_url.get("url") if isinstance(image_url, dict) else image_url
        if not isinstance(url, str) or not url:
            raise InvalidRequestError(f"{where}.url must be a non-empty string", where)
        data = self._fetch(url.strip(), where)
        self.images.append(decode_image(data, self.limits, where))
        return self.marker

    def _fetch(self, url: str, where: str) -> bytes:
        scheme = url.split(":", 1)[0].lower()
        if scheme in ("http", "https"):
            raise InvalidRequestError(
                f"{where}: remote image URLs are not fetched; send a data: URI (or a "
                "file:// URL under --media-path)",
                where,
            )
        if scheme == "data":
            return _data_uri(url, self.limits, where)
        if scheme == "file":
            return _local_file(url, self.media_path, self.limits, where)
        raise InvalidRequestError(f"{where} must be a data: URI or a file:// URL", where)


def _data_uri(url: str, limits: ImageLimits, where: str) -> bytes:
    match = _DATA_URI.match(url)
    if match is None:
        raise InvalidRequestError(f"{where} is not a valid data: URI", where)
    mime = match.group(1).strip().lower()
    if mime not in MIME_FORMATS:
        allowed = ", ".join(sorted(MIME_FORMATS))
        raise InvalidRequestError(
            f"{where}: image type {mime or '(none)'!r} is not supported (use {allowed})", where
        )
    if "base64" not in [p.strip().lower() for p in match.group(2).split(";")]:
        raise InvalidRequestError(f"{where}: the data: URI must be base64-encoded", where)
    payload = "".join(match.group(3).split())
    if len(payload) * 3 // 4 > limits.max_bytes:
        raise InvalidRequestError(
            f"{where}: the image is larger than {limits.max_bytes} bytes", where
        )
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequestError(f"{where} has invalid base64 data", where) from None
    if not data:
        raise InvalidRequestError(f"{where} has no image data", where)
    return data


def _local_file(url: str, media_path: str | None, limits: ImageLimits, where: str) -> bytes:
    if media_path is None:
        raise InvalidRequestError(
            f"{where}: file:// image URLs need the server's --media-path", where
        )
    parsed = urlparse(url)
    if parsed.netloc not in ("", "localhost"):
        raise InvalidRequestError(f"{where}: file:// URLs must name a local path", where)
    relative = unquote(parsed.path).lstrip("/")
    if "\x00" in relative:  # os.path and open() raise ValueError on a NUL byte
        raise InvalidRequestError(f"{where}: the path holds a NUL character", where)
    root = os.path.realpath(media_path)
    path = os.path.realpath(os.path.join(root, relative))
    if os.path.commonpath([root, path]) != root:
        raise InvalidRequestError(f"{where}: the path is outside --media-path", where)
    if not os.path.isfile(path):
        raise InvalidRequestError(f"{where}: no such file under --media-path", where)
    if os.path.getsize(path) > limits.max_bytes:
        raise InvalidRequestError(
            f"{where}: the image is larger than {limits.max_bytes} bytes", where
        )
    with open(path, "rb") as f:
        return f.read(limits.max_bytes + 1)


def decode_image(data: bytes, limits: ImageLimits, where: str) -> PromptImage:
    """PNG/JPEG/WebP/GIF bytes -> RGB pixels (a GIF's first frame), within `limits`."""
    if len(data) > limits.max_bytes:
        raise InvalidRequestError(
            f"{where}: the image is larger than {limits.max_bytes} bytes", where
        )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data), formats=_FORMATS)
            w, h = img.size
            if w <= 0 or h <= 0 or w * h > limits.max_pixels:
                raise InvalidRequestError(
                    f"{where}: the image is {w}x{h}, more than {limits.max_pixels} pixels",
                    where,
                )
            img.seek(0)
            rgb = img.convert("RGB").tobytes()
    except InvalidRequestError:
        raise
    except UnidentifiedImageError:
        raise InvalidRequestError(f"{where} is not a PNG, JPEG, WebP or GIF image", where) from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise InvalidRequestError(f"{where}: the image has too many pixels", where) from None
    except (OSError, ValueError, SyntaxError, EOFError):
        raise InvalidRequestError(f"{where}: the image data is corrupt", where) from None
    digest = hashlib.sha256(f"{w}x{h}:".encode() + rgb).hexdigest()
    return PromptImage(digest, w, h, rgb)
