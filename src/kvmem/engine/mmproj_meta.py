"""What a projector and a text model GGUF say about their sizes, read from the files'
metadata (memory-mapped by the gguf package) before llama.cpp loads any weights."""

from __future__ import annotations

from pathlib import Path

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
    reader = _reader(path, "--mmproj")
    if _field(reader, "general.architecture") != "clip":
        raise ConfigError("--mmproj", f"{path} is not a multimodal projector (clip) GGUF")
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
    """The text model's embedding size (`<arch>.embedding_length`)."""
    reader = _reader(path, "--model")
    arch = _field(reader, "general.architecture")
    value = _field(reader, f"{arch}.embedding_length")
    if value is None:
        raise ConfigError("--model", f"{path} does not say its embedding size")
    return int(value)


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
