"""Speculative decoding settings (`--spec-type`, `--spec-draft-n-max`, `--spec-kv-dtype`).

Names follow llama.cpp's common/speculative.cpp: `ngram-simple` is prompt lookup (drafts
from n-gram matches in the session's own history; `draft-ngram` is accepted as an alias),
`draft-mtp` drafts with the model's own MTP (nextn) layers. `none` turns drafting off.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from kvmem.errors import ConfigError
from kvmem.memory.ggml_types import GgmlType
from kvmem.settings import Group, Program, setting

MAX_DRAFT = 16
# architectures whose MTP graph and draft memory the drafter (engine/mtp_draft.py) is built
# and tested for: one nextn block with a plain attention KV cache of its own
MTP_ARCHS = ("qwen35",)


class SpecType(Enum):
    NONE = "none"
    NGRAM = "ngram-simple"
    MTP = "draft-mtp"


SPEC_TYPE_NAMES = {
    "none": SpecType.NONE,
    "ngram-simple": SpecType.NGRAM,
    "draft-ngram": SpecType.NGRAM,
    "draft-mtp": SpecType.MTP,
}
SPEC_KV_TYPES = {"f16": GgmlType.F16, "q8_0": GgmlType.Q8_0}


def parse_spec_type(text: str) -> SpecType:
    try:
        return SPEC_TYPE_NAMES[text.strip().lower()]
    except KeyError:
        raise ConfigError(
            "--spec-type", f"unknown type {text!r}: use one of {', '.join(SPEC_TYPE_NAMES)}"
        ) from None


_SPEC = {"programs": Program.BOTH, "group": Group.SPEC}


@dataclass(frozen=True, slots=True)
class SpecConfig:
    """The `--spec-*` settings; each field declares its flag. The flags' values are
    resolved together (a draft bound needs a draft type) in kvmem.cli.spec_flags."""

    type: SpecType = setting(
        SpecType.NONE, "--spec-type", help=f"draft source: {', '.join(SPEC_TYPE_NAMES)}",
        parse=str, flag_default="none", to_field=parse_spec_type, metavar="TYPE", **_SPEC,
    )  # fmt: skip
    n_max: int = setting(  # draft tokens per step at most
        3, "--spec-draft-n-max", help="draft tokens per step at most", parse=str,
        flag_default=None, metavar="N", shown="3", **_SPEC,
    )  # fmt: skip
    gate: bool = setting(  # draft only while drafting is faster than plain steps (draft_gate.py)
        True, "--spec-gate",
        help="draft only while steps with drafts are faster than plain steps (measured as it "
        "decodes); --no-spec-gate drafts every step", negative=("--no-spec-gate",), **_SPEC,
    )  # fmt: skip
    kv_type: GgmlType = setting(  # the draft's KV cache type (draft-mtp)
        GgmlType.F16, "--spec-kv-dtype", help="draft KV cache type for draft-mtp: f16 or q8_0",
        parse=str, flag_default=None, metavar="TYPE", shown="f16", **_SPEC,
    )  # fmt: skip

    @property
    def enabled(self) -> bool:
        return self.type is not SpecType.NONE

    @property
    def wants_mtp(self) -> bool:
        """Drafts from the model's MTP head: the weights load with their nextn layers."""
        return self.type is SpecType.MTP

    def validate(self) -> None:
        """The settings alone; whether the model has an MTP head is checked from its GGUF
        metadata (engine.nextn_meta) before the weights load."""
        if not 1 <= self.n_max <= MAX_DRAFT:
            raise ConfigError("--spec-draft-n-max", f"must be in 1..{MAX_DRAFT}, got {self.n_max}")
        if self.kv_type not in SPEC_KV_TYPES.values():
            raise ConfigError("--spec-kv-dtype", f"use f16 or q8_0, got {self.kv_type.label}")

    def describe(self) -> dict[str, object]:
        """The speculative state for /props and the startup record."""
        return {
            "type": self.type.value,
            "n_max": self.n_max if self.enabled else 0,
            "kv_type": self.kv_type.label if self.type is SpecType.MTP else None,
        }
