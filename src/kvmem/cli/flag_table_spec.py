"""The flag table's speculative-decoding rows (llama.cpp's names), for kvmem-cli and
kvmem-server. `--spec-type ngram-simple` (alias `draft-ngram`) turns on prompt-lookup
drafts; `--spec-draft-n-max N` bounds the draft per step; `--spec-kv-dtype f16|q8_0` is the
draft KV type of `draft-mtp` (MTP-head drafts). The values are checked together in
`spec_flags.spec_config_from_args`, before any model loads."""

from __future__ import annotations

from kvmem.spec_config import SPEC_TYPE_NAMES, SpecConfig

from .flag_spec import Flag, Group, Program

_D = SpecConfig()

# fmt: off
SPEC_TABLE: tuple[Flag, ...] = (
    Flag(("--spec-type",), "spec_type", f"draft source: {', '.join(SPEC_TYPE_NAMES)}", str,
         _D.type.value, metavar="TYPE", programs=Program.BOTH, group=Group.SPEC),
    Flag(("--spec-draft-n-max",), "spec_draft_n_max", "draft tokens per step at most", str,
         None, metavar="N", shown_default=str(_D.n_max), programs=Program.BOTH,
         group=Group.SPEC),
    Flag(("--spec-gate",), "spec_gate",
         "draft only while steps with drafts are faster than plain steps (measured as it "
         "decodes); --no-spec-gate drafts every step", None, _D.gate,
         negative=("--no-spec-gate",), programs=Program.BOTH, group=Group.SPEC),
    Flag(("--spec-kv-dtype",), "spec_kv_dtype", "draft KV cache type for draft-mtp: f16 or q8_0",
         str, None, metavar="TYPE", shown_default="f16", programs=Program.BOTH,
         group=Group.SPEC),
)
# fmt: on
