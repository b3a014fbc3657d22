"""What a projector and a text model GGUF say about their sizes, read from the files'
metadata (memory-mapped by the gguf package) before llama.cpp loads any weights."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO

from gguf import GGUFReader

from kvmem.errors import ConfigError

# the projector's last layer, by projector family: its output width is the text n_embd
_OUTPUT_TENSORS = ("mm.2.weight", "mm.model.fc.weight", "mm.input_projection.weight")


def _reader(path: str, flag: str) -> GGUFReader:
    try:
        return GGUFReader(path)
    except (OSError, ValueError) as exc:
        raise ConfigError(flag, f"{path} is not a readable GGUF file: {exc}") from None


def _field(reader: GGUFReader, key: str):
    field = reader.get_field(key)
    return None if field is None else field.contents()


def projector_text_embd(path: str) -> int:
    """The text-embedding size the projector at `path` produces (ConfigError if it is
    not a vision projector)."""
    if _header(path, "--mmproj")[0] != "clip":  # before parsing a whole model's metadata
        raise ConfigError("--mmproj", f"{path} is not a multimodal projector (clip) GGUF")
    reader = _reader(path, "--mmproj")
    if not _field(reader, "clip.has_vision_encoder"):
        raise ConfigError("--mmproj", f"{path} has no vision encoder")
    for tensor in reader.tensors:
        if tensor.name in _OUTPUT_TENSORS:
            return int(tensor.shape[-1]) if len(tensor.shape) > 1 else int(tensor.shape[0])
    dim = _field(reader, "clip.vision.projection_dim")
    if dim is None:
        raise ConfigError("--mmproj", f"{path} does not say its output size")
    return int(dim)


def model_embd(path: str) -> int:
    """The text model's embedding size (`<arch>.embedding_length`), read from the header
    alone: the metadata is scanned up to that key, never the tokenizer's arrays after it."""
    _arch, value = _header(path, "--model")
    if value is None:
        raise ConfigError("--model", f"{path} does not say its embedding size")
    return value


# GGUF value types -> struct formats of the scalars (8: string, 9: array)
_SCALARS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}


def _read(f: BinaryIO, fmt: str):
    size = struct.calcsize("<" + fmt)
    data = f.read(size)
    if len(data) != size:
        raise ValueError("truncated header")
    return struct.unpack("<" + fmt, data)[0]


def _string(f: BinaryIO) -> str:
    n = _read(f, "Q")
    if n > 1 << 20:
        raise ValueError("implausible string length")
    return f.read(n).decode("utf-8", "replace")


def _skip(f: BinaryIO, kind: int) -> None:
    if kind in _SCALARS:
        f.seek(struct.calcsize("<" + _SCALARS[kind]), 1)
    elif kind == 8:
        f.seek(_read(f, "Q"), 1)
    elif kind == 9:
        item, n = _read(f, "I"), _read(f, "Q")
        if item in _SCALARS:
            f.seek(n * struct.calcsize("<" + _SCALARS[item]), 1)
        else:
            for _ in range(n):
                _skip(f, item)
    else:
        raise ValueError(f"unknown GGUF value type {kind}")


def _header(path: str, flag: str) -> tuple[str | None, int | None]:
    """(general.architecture, <arch>.embedding_length) from the header of `path`."""
    return arch_scalar(path, flag, "embedding_length")


def arch_scalar(path: str, flag: str, name: str) -> tuple[str | None, int | None]:
    """(general.architecture, the integer `<arch>.<name>` or None) from the header of the
    GGUF at `path`, scanned only up to that key; ConfigError naming `flag` if unreadable."""
    try:
        with open(path, "rb") as f:
            return _scan(f, name)
    except (OSError, ValueError, struct.error) as exc:
        raise ConfigError(flag, f"{path} is not a readable GGUF file: {exc}") from None


def _scan(f: BinaryIO, name: str) -> tuple[str | None, int | None]:
    if f.read(4) != b"GGUF" or _read(f, "I") < 2:
        raise ValueError("not a GGUF v2+ file")
    _read(f, "Q")  # tensors
    arch: str | None = None
    for _ in range(_read(f, "Q")):
        key, kind = _string(f), _read(f, "I")
        if key == "general.architecture" and kind == 8:
            arch = _string(f)
        elif arch is not None and key == f"{arch}.{name}" and kind in _SCALARS:
            return arch, int(_read(f, _SCALARS[kind]))
        else:
            _skip(f, kind)
    return arch, None


def check_projector(mmproj: str, model_path: str) -> int:
    """ConfigError unless the projector exists and feeds the model's embedding size;
    returns that size."""
    if not Path(mmproj).is_file():
        raise ConfigError("--mmproj", f"file not found: {mmproj}")
    want, got = model_embd(model_path), projector_text_embd(mmproj)
    if want != got:
        raise ConfigError(
            "--mmproj",
            f"the projector produces {got}-wide embeddings but the model's embedding size "
            f"is {want}",
        )
    return got
