"""Whether a model GGUF has an MTP (nextn) head, read from its metadata before llama.cpp
loads any weights: `--spec-type draft-mtp` on a model without one fails early and clearly.
Only the header's key/value section is scanned (the tokenizer's arrays are skipped)."""

from __future__ import annotations

import struct
from typing import BinaryIO

from kvmem.errors import ConfigError
from kvmem.spec_config import MTP_ARCHS

from .mmproj_meta import _SCALARS, _read, _skip, _string


def nextn_layers(path: str) -> tuple[str | None, int]:
    """(general.architecture, `<arch>.nextn_predict_layers` or 0) of the GGUF at `path`."""
    try:
        with open(path, "rb") as f:
            return _scan(f)
    except (OSError, ValueError, struct.error) as exc:
        raise ConfigError("-m", f"{path} is not a readable GGUF file: {exc}") from None


def _scan(f: BinaryIO) -> tuple[str | None, int]:
    if f.read(4) != b"GGUF" or _read(f, "I") < 2:
        raise ValueError("not a GGUF v2+ file")
    _read(f, "Q")  # tensors
    arch: str | None = None
    for _ in range(_read(f, "Q")):
        key, kind = _string(f), _read(f, "I")
        if key == "general.architecture" and kind == 8:
            arch = _string(f)
        elif arch is not None and key == f"{arch}.nextn_predict_layers" and kind in _SCALARS:
            return arch, int(_read(f, _SCALARS[kind]))
        else:
            _skip(f, kind)
    return arch, 0


def check_mtp_head(path: str) -> None:
    """ConfigError unless the model at `path` has a nextn layer of an architecture the
    drafter supports."""
    arch, n = nextn_layers(path)
    if n < 1:
        raise ConfigError(
            "--spec-type",
            f"draft-mtp needs a model with an MTP (nextn) head; {path} has none "
            "(no nextn_predict_layers in its metadata): use ngram-simple",
        )
    if arch not in MTP_ARCHS:
        raise ConfigError(
            "--spec-type",
            f"draft-mtp supports {', '.join(MTP_ARCHS)} models; {path} is {arch}: use ngram-simple",
        )
