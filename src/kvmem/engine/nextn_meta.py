"""Whether a model GGUF has an MTP (nextn) head, read from its metadata before llama.cpp
loads any weights: `--spec-type draft-mtp` on a model without one fails early and clearly."""

from __future__ import annotations

from gguf import GGUFReader

from kvmem.errors import ConfigError


def nextn_layers(path: str) -> int:
    """`<arch>.nextn_predict_layers` of the GGUF at `path` (0 when absent)."""
    try:
        reader = GGUFReader(path)
    except (OSError, ValueError) as exc:
        raise ConfigError("-m", f"{path} is not a readable GGUF file: {exc}") from None
    arch_field = reader.get_field("general.architecture")
    arch = arch_field.contents() if arch_field is not None else ""
    field = reader.get_field(f"{arch}.nextn_predict_layers")
    return int(field.contents()) if field is not None else 0


def check_mtp_head(path: str) -> None:
    """ConfigError unless the model at `path` has at least one nextn layer."""
    if nextn_layers(path) < 1:
        raise ConfigError(
            "--spec-type",
            f"draft-mtp needs a model with an MTP (nextn) head; {path} has none "
            "(no nextn_predict_layers in its metadata): use ngram-simple",
        )
