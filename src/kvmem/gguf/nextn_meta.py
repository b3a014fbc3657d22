"""Whether a model GGUF has an MTP (nextn) head, read from its metadata before llama.cpp
loads any weights: `--spec-type draft-mtp` on a model without one fails early and clearly.
Only the header's key/value section is scanned (the tokenizer's arrays are skipped)."""

from __future__ import annotations

from kvmem.errors import ConfigError
from kvmem.gguf.mmproj_meta import arch_scalar
from kvmem.spec_config import MTP_ARCHS


def nextn_layers(path: str) -> tuple[str | None, int]:
    """(general.architecture, `<arch>.nextn_predict_layers` or 0) of the GGUF at `path`."""
    arch, n = arch_scalar(path, "-m", "nextn_predict_layers")
    return arch, n or 0


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
