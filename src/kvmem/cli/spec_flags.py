"""The speculative-decoding settings from the parsed flags (declared on `SpecConfig`).

`--spec-type ngram-simple` (alias `draft-ngram`) turns on prompt-lookup drafts;
`--spec-draft-n-max N` bounds the draft per step (default 3); `--spec-kv-dtype f16|q8_0`
is the draft KV type of `draft-mtp` (the model's MTP head; engine/mtp_draft.py).
"""

from __future__ import annotations

import argparse

from kvmem.errors import ConfigError
from kvmem.spec_config import SPEC_KV_TYPES, SpecConfig, SpecType, parse_spec_type

_DEFAULTS = SpecConfig()


def spec_config_from_args(ns: argparse.Namespace) -> SpecConfig:
    """Build and validate the speculative settings; raises ConfigError naming the flag."""
    spec_type = parse_spec_type(ns.spec_type)
    n_max = _DEFAULTS.n_max
    if ns.spec_n_max is not None:
        text = str(ns.spec_n_max).strip()
        if not text.isdigit():
            raise ConfigError("--spec-draft-n-max", f"invalid integer value: {text!r}")
        n_max = int(text)
        if spec_type is SpecType.NONE:
            raise ConfigError("--spec-draft-n-max", "needs --spec-type (drafting is off)")
    kv_type = _DEFAULTS.kv_type
    if ns.spec_kv_type is not None:
        name = str(ns.spec_kv_type).strip().lower()
        if name not in SPEC_KV_TYPES:
            raise ConfigError("--spec-kv-dtype", f"use f16 or q8_0, got {ns.spec_kv_type!r}")
        if spec_type is not SpecType.MTP:
            raise ConfigError("--spec-kv-dtype", "applies to --spec-type draft-mtp only")
        kv_type = SPEC_KV_TYPES[name]
    gate = _DEFAULTS.gate if ns.spec_gate is None else bool(ns.spec_gate)
    config = SpecConfig(type=spec_type, n_max=n_max, kv_type=kv_type, gate=gate)
    config.validate()
    return config
