"""The speculative-decoding flags (llama.cpp's names), shared by kvmem-cli and kvmem-server.

`--spec-type ngram-simple` (alias `draft-ngram`) turns on prompt-lookup drafts;
`--spec-draft-n-max N` bounds the draft per step (default 3); `--spec-kv-dtype f16|q8_0`
is the draft KV type of `draft-mtp`, which this build refuses (see spec_config.py).
"""

from __future__ import annotations

import argparse

from kvmem.errors import ConfigError
from kvmem.spec_config import SPEC_KV_TYPES, SPEC_TYPE_NAMES, SpecConfig, SpecType, parse_spec_type

_DEFAULTS = SpecConfig()


def add_spec_arguments(parser: argparse.ArgumentParser) -> None:
    # --- speculative decoding (one block; ported as-is into the flag table) ---
    group = parser.add_argument_group("speculative decoding")
    group.add_argument(
        "--spec-type",
        dest="spec_type",
        metavar="TYPE",
        default=_DEFAULTS.type.value,
        help=f"draft source: {', '.join(SPEC_TYPE_NAMES)} (default: none)",
    )
    group.add_argument(
        "--spec-draft-n-max",
        dest="spec_draft_n_max",
        metavar="N",
        default=None,
        help=f"draft tokens per step at most (default: {_DEFAULTS.n_max})",
    )
    group.add_argument(
        "--spec-kv-dtype",
        dest="spec_kv_dtype",
        metavar="TYPE",
        default=None,
        help="draft KV cache type for draft-mtp: f16 or q8_0 (default: f16)",
    )


def spec_config_from_args(ns: argparse.Namespace) -> SpecConfig:
    """Build and validate the speculative settings; raises ConfigError naming the flag."""
    spec_type = parse_spec_type(ns.spec_type)
    n_max = _DEFAULTS.n_max
    if ns.spec_draft_n_max is not None:
        text = str(ns.spec_draft_n_max).strip()
        if not text.isdigit():
            raise ConfigError("--spec-draft-n-max", f"invalid integer value: {text!r}")
        n_max = int(text)
        if spec_type is SpecType.NONE:
            raise ConfigError("--spec-draft-n-max", "needs --spec-type (drafting is off)")
    kv_type = _DEFAULTS.kv_type
    if ns.spec_kv_dtype is not None:
        name = str(ns.spec_kv_dtype).strip().lower()
        if name not in SPEC_KV_TYPES:
            raise ConfigError("--spec-kv-dtype", f"use f16 or q8_0, got {ns.spec_kv_dtype!r}")
        if spec_type is not SpecType.MTP:
            raise ConfigError("--spec-kv-dtype", "applies to --spec-type draft-mtp only")
        kv_type = SPEC_KV_TYPES[name]
    config = SpecConfig(type=spec_type, n_max=n_max, kv_type=kv_type)
    config.validate()
    return config
