"""The flag table's rows shared by kvmem-cli and kvmem-server: KV cache types and `--kvmem-*`.

Values are parsed with strict number types; the cross-field checks (`KVMemConfig.validate`,
`KVCacheTypes.validate`) run in `kvmem_flags.kvmem_config_from_args`, before any model loads.
"""

from __future__ import annotations

from enum import Enum

from kvmem.cli import arg_types as t
from kvmem.config import KVMemConfig
from kvmem.memory.ggml_types import KV_TYPE_NAMES, parse_kv_type

from .flag_spec import Flag, Group, Program

_D = KVMemConfig()
_BOTH = Program.BOTH


def _kv_type_name(text: str) -> str:
    return parse_kv_type(text, "cache type").label


def _kv(flags: tuple[str, ...], dest: str, help_text: str, env: str | None) -> Flag:
    return Flag(
        flags,
        dest,
        help_text,
        str,
        None,
        env,
        metavar="TYPE",
        shown_default="f16",
        programs=_BOTH,
        group=Group.KV_CACHE,
        env_parse=_kv_type_name,
    )


def _int(name: str, help_text: str, default: int, shown: str | None = None) -> Flag:
    return Flag(
        (f"--kvmem-{name}",),
        f"kvmem_{name.replace('-', '_')}",
        help_text,
        t.int32,
        default,
        metavar="N",
        shown_default=shown,
        programs=_BOTH,
        group=Group.KVMEM,
    )


def _choice(name: str, default: Enum, help_text: str) -> Flag:
    return Flag(
        (f"--kvmem-{name}",),
        f"kvmem_{name.replace('-', '_')}",
        help_text,
        str,
        default.value,
        choices=tuple(m.value for m in type(default)),
        programs=_BOTH,
        group=Group.KVMEM,
    )


_TYPES = ", ".join(KV_TYPE_NAMES)

# fmt: off
KV_CACHE_TABLE: tuple[Flag, ...] = (
    _kv(("-ctk", "--cache-type-k"), "cache_type_k", f"K cache type: {_TYPES}", "LLAMA_ARG_CACHE_TYPE_K"),
    _kv(("-ctv", "--cache-type-v"), "cache_type_v", f"V cache type: {_TYPES}", "LLAMA_ARG_CACHE_TYPE_V"),
    _kv(("--kv-dtype",), "kv_dtype", "set both K and V cache types", None),
)

KVMEM_TABLE: tuple[Flag, ...] = (
    Flag(("--no-kvmem",), "no_kvmem", "plain llama.cpp with a full-size context (for comparison)",
         None, False, programs=_BOTH, group=Group.KVMEM),
    _int("budget", "GPU KV tokens for the selected working set", _D.budget),
    _int("gen-reserve", "GPU KV tokens reserved for new tokens", _D.gen_reserve),
    _int("block-tokens", "tokens per block", _D.block_tokens),
    _int("sink-blocks", "blocks at the start always kept", _D.sink_blocks),
    _int("recent-blocks", "most recent blocks always kept", _D.recent_blocks),
    _choice("method", _D.method, "block selection"),
    _choice("score-mode", _D.score_mode,
            "block summary scored against the query: bound (per-channel min/max, as in "
            "Quest) or mean (mean key)"),
    _choice("score-aggregate", _D.score_aggregate,
            "per-block score from the query rows' attention over blocks: mean (over tokens and "
            "heads) or max (the largest share any row gives the block)"),
    _int("score-mlogits",
         "bound on the logits (query rows x blocks x heads x layers, in millions) one "
         "reselection computes; past it an even sample of the query tokens is scored",
         _D.score_mlogits, "128; 0 = no bound"),
    _int("score-threads", "threads that score a reselection (0 = one per CPU, at most 16)",
         _D.score_threads),
    _choice("positions", _D.positions,
            "where retrieved blocks sit in the window: gather (right before the recent "
            "blocks, in order) or original (their own positions, with gaps)"),
    _choice("query-replay", _D.query_replay, "replay the query after reselection"),
    _choice("query-policy", _D.query_policy,
            "retrieval query: agent (the last user message and the live trajectory's tail), "
            "user (the last user message) or tail (the prompt's tail); without a user message "
            "the query is the prompt's tail"),
    _int("query-max-tokens", "last N tokens of the query used", _D.query_max_tokens),
    _choice("query-source", _D.query_source,
            "where the query vectors come from: main (the main context's eval callback) or "
            "scoring (a second small context that decodes the sink and the query; the main "
            "context then runs without an eval callback, as stock llama.cpp)"),
    _choice("query-ahead", _D.query_ahead,
            "with --kvmem-query-source scoring: on computes the query rows and the block "
            "scores on a worker thread while the main context prefills, so the plan only "
            "picks; off computes them after the prefill"),
    _int("control-tokens", "bound of the control-text tier (system prompt, tool definitions)",
         -1, "-1 = budget/4"),
    _int("trajectory-tokens",
         "bound of the live-trajectory tier (tool calls and results after the task)",
         -1, "-1 = budget/4"),
    _int("stream-tokens",
         "bound of the newest tokens a prefill chunk sees besides sink and control",
         -1, "-1 = budget/2"),
    _int("harvest-tokens",
         "complete blocks wait on the GPU until this many tokens of them do, then go to the "
         "host in one state read (fewer GPU synchronisations in a prefill); always before an "
         "eviction, a reselection and the end of a turn", _D.harvest_tokens,
         "0 = each decode's blocks at once"),
    _int("stream-cap",
         "diagnostic: cap on the KV tokens a prefill chunk sees, whatever the capacity "
         "(the fidelity decomposition)", _D.stream_cap, "0 = no cap"),
    _choice("rank", _D.rank,
            "what ranks the retrieval candidates: summary (the block summaries, "
            "--kvmem-score-mode), exact (the exact attention mass of the query rows over "
            "every stored key: the fidelity oracle, CPU-heavy) or rerank (the summaries' best "
            "2x budget blocks reordered by their exact mass, normalized with the pinned tiers)"),
    Flag(("--kvmem-score-layers",), "kvmem_score_layers", "attention layers used for scoring",
         t.layer_list, (), metavar="L1,L2,...",
         shown_default="layers 1..n-1, 23 spread on deeper models", programs=_BOTH,
         group=Group.KVMEM),
    Flag(("--kvmem-disk-dir",), "kvmem_disk_dir", "disk tier and restart-safe session store",
         str, None, metavar="DIR", shown_default="none, RAM only", programs=_BOTH,
         group=Group.KVMEM),
    _int("host-mib", "RAM cap of the block store in MiB; older blocks go to disk", 0,
         "0 = no cap"),
    _int("disk-mib", "disk cap of the block store in MiB", 0, "0 = no cap"),
    _int("conversations",
         "conversations kept warm in host memory; a request goes to the one sharing the "
         "longest prefix", 1),
    _int("conversations-mib",
         "cap in MiB on the conversations' stored blocks (RAM and disk); past it the least "
         "recently used conversation is evicted", 0, "0 = no cap"),
    Flag(("--kvmem-trace",), "kvmem_trace",
         "print KVMEM_* trace records on stderr (also KVMEM_TRACE=1)", None, None,
         negative=("--no-kvmem-trace",), shown_default="KVMEM_TRACE", programs=_BOTH,
         group=Group.KVMEM),
)
# fmt: on
