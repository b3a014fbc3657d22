"""Images through llama.cpp's mtmd: a projector context, encoded images cached by content
hash, and the stand-in token ids that put an image's embedding rows into a prompt.

An encoded image is a short sequence of items: the text tokens its projector wraps it in
(none for a llava-style projector) and one stand-in id per embedding row. A stand-in is a
negative number, -(1 + slot * ROW_SPAN + row), where the slot comes from the SHA-256 of
the image's pixels (the next free slot on a collision). The same image therefore gets the
same ids in every turn, and after a restart too (a stored session's history), so the token
history's prefix matching reuses its KV like text; `media_prefill` turns the ids back into
embedding rows when they are decoded.
"""

from __future__ import annotations

import collections
import ctypes
import hashlib
import logging
import time
from dataclasses import dataclass

import llama_cpp
import numpy as np
from llama_cpp import mtmd_cpp as mtmd

from kvmem.engine_settings import VisionSettings
from kvmem.errors import ConfigError, InvalidRequestError, ModelLoadError

from ..llama.model import LlamaModel

logger = logging.getLogger(__name__)

ROW_SPAN = 1 << 16  # stand-in ids per image slot: at most this many rows per image
_SLOTS = (1 << 31) // ROW_SPAN - 1
_CHUNK_TEXT = 0  # MTMD_INPUT_CHUNK_TYPE_TEXT
_CHUNK_IMAGE = 1  # MTMD_INPUT_CHUNK_TYPE_IMAGE


def is_standin(token: int) -> bool:
    return token < 0


@dataclass(slots=True)
class EncodedImage:
    digest: str
    slot: int
    items: list[int]  # text ids and stand-ins, in prompt order
    rows: np.ndarray  # float32 [n_rows, n_embd]
    encode_ms: float

    @property
    def n_rows(self) -> int:
        return int(self.rows.shape[0])


class VisionProjector:
    """One mtmd context on a loaded text model; encodes images and answers stand-ins."""

    def __init__(self, model: LlamaModel, settings: VisionSettings) -> None:
        self.settings = settings
        p = mtmd.mtmd_context_params_default()
        p.use_gpu = settings.offload
        p.n_threads = settings.n_threads
        p.print_timings = False
        p.warmup = False
        if settings.image_min_tokens > 0:
            p.image_min_tokens = settings.image_min_tokens
        if settings.image_max_tokens > 0:
            p.image_max_tokens = settings.image_max_tokens
        ptr = mtmd.mtmd_init_from_file(settings.mmproj.encode(), model.ptr, p)
        if not ptr:
            raise ModelLoadError(f"mtmd failed to load the projector {settings.mmproj}")
        self.ptr = ptr
        if not mtmd.mtmd_support_vision(ptr):
            self.close()
            raise ConfigError("--mmproj", f"{settings.mmproj} has no vision encoder")
        if mtmd.mtmd_decode_use_mrope(ptr):
            self.close()
            raise ConfigError("--mmproj", "M-RoPE projectors are not supported yet")
        self.n_embd = llama_cpp.llama_model_n_embd(model.ptr)
        self.marker = mtmd.mtmd_default_marker().decode()
        self._images: collections.OrderedDict[str, EncodedImage] = collections.OrderedDict()
        self._by_slot: dict[int, EncodedImage] = {}
        self.encoded = 0  # images run through the encoder (cache misses)
        self.encode_ms = 0.0

    # encoding ----------------------------------------------------------------------------
    def encode(self, digest: str, width: int, height: int, rgb: bytes) -> EncodedImage:
        """The image (RGB, row-major) as prompt items; cached by `digest`."""
        hit = self._images.get(digest)
        if hit is not None:
            self._images.move_to_end(digest)
            return hit
        if len(rgb) != width * height * 3:
            raise InvalidRequestError("image data does not match its size", "messages")
        t0 = time.perf_counter()
        items_raw, rows = self._run(digest, width, height, rgb)
        if len(rows) > ROW_SPAN:
            raise InvalidRequestError(f"an image may have at most {ROW_SPAN} rows", "messages")
        slot = self._take_slot(digest)
        items = [-(1 + slot * ROW_SPAN + int(r)) if is_row else int(r) for is_row, r in items_raw]
        ms = (time.perf_counter() - t0) * 1e3
        image = EncodedImage(digest, slot, items, rows, ms)
        self._images[digest] = image
        self._by_slot[slot] = image
        self.encoded += 1
        self.encode_ms += ms
        self._trim()
        logger.info("encoded image %s: %d rows in %.1f ms", digest[:12], len(rows), ms)
        return image

    def _run(
        self, digest: str, width: int, height: int, rgb: bytes
    ) -> tuple[list[tuple[bool, int]], np.ndarray]:
        buf = (ctypes.c_uint8 * len(rgb)).from_buffer_copy(rgb)
        bitmap = mtmd.mtmd_bitmap_init(width, height, buf)
        if not bitmap:
            raise InvalidRequestError("the image could not be prepared", "messages")
        chunks = mtmd.mtmd_input_chunks_init()
        try:
            mtmd.mtmd_bitmap_set_id(bitmap, digest.encode())
            marker = self.marker.encode()
            text = mtmd.mtmd_input_text(marker, len(marker), False, True)
            bitmaps = (mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap)
            rc = mtmd.mtmd_tokenize(self.ptr, chunks, ctypes.byref(text), bitmaps, 1)
            if rc != 0:
                raise InvalidRequestError(f"mtmd could not tokenize the image ({rc})", "messages")
            return self._collect(chunks)
        finally:
            mtmd.mtmd_input_chunks_free(chunks)
            mtmd.mtmd_bitmap_free(bitmap)

    def _collect(self, chunks) -> tuple[list[tuple[bool, int]], np.ndarray]:
        items: list[tuple[bool, int]] = []
        parts: list[np.ndarray] = []
        for i in range(mtmd.mtmd_input_chunks_size(chunks)):
            chunk = mtmd.mtmd_input_chunks_get(chunks, i)
            kind = mtmd.mtmd_input_chunk_get_type(chunk)
            if kind == _CHUNK_TEXT:
                n = ctypes.c_size_t(0)
                ptr = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                items += [(False, int(ptr[k])) for k in range(n.value)]
            elif kind == _CHUNK_IMAGE:
                n_rows = mtmd.mtmd_input_chunk_get_n_tokens(chunk)
                if mtmd.mtmd_decode_use_non_causal(self.ptr, chunk):
                    raise InvalidRequestError(
                        "this projector needs non-causal image decoding (not supported)",
                        "messages",
                    )
                if mtmd.mtmd_encode_chunk(self.ptr, chunk) != 0:
                    raise InvalidRequestError("the vision encoder failed on the image", "messages")
                out = mtmd.mtmd_get_output_embd(self.ptr)
                data = np.ctypeslib.as_array(out, shape=(n_rows * self.n_embd,))
                start = sum(len(p) for p in parts)
                parts.append(data.reshape(n_rows, self.n_embd).copy())  # [n_rows, n_embd]
                items += [(True, start + k) for k in range(n_rows)]
            else:
                raise InvalidRequestError("the projector produced a non-image chunk", "messages")
        n_embd = self.n_embd
        rows = np.concatenate(parts) if parts else np.zeros((0, n_embd), np.float32)
        return items, rows

    def _take_slot(self, digest: str) -> int:
        """The digest's own slot, or the next one a different cached image does not hold."""
        slot = int(hashlib.sha256(digest.encode()).hexdigest()[:12], 16) % _SLOTS
        for _ in range(_SLOTS):
            if slot not in self._by_slot:
                return slot
            slot = (slot + 1) % _SLOTS
        raise InvalidRequestError("too many images are cached", "messages")

    def _trim(self) -> None:
        """Drop least-recently used images past the cache budget (never the newest)."""
        total = sum(im.rows.nbytes for im in self._images.values())
        while len(self._images) > 1 and total > self.settings.cache_bytes:
            _, old = self._images.popitem(last=False)
            self._by_slot.pop(old.slot, None)
            total -= old.rows.nbytes

    # decoding ----------------------------------------------------------------------------
    def row(self, token: int) -> np.ndarray:
        """The embedding row [n_embd] a stand-in id stands for."""
        slot, row = divmod(-token - 1, ROW_SPAN)
        image = self._by_slot.get(slot)
        if image is None or row >= image.n_rows:
            raise InvalidRequestError(
                "an image of the history is no longer cached; resend the conversation",
                "messages",
            )
        return image.rows[row]

    def close(self) -> None:
        if self.ptr:
            mtmd.mtmd_free(self.ptr)
            self.ptr = None
