"""The flag table's rows for llama-server flags that a stock launch line passes and KVMem
handles specially.

- `NOOP_TABLE`: switches accepted as documented no-ops, because KVMem's single session
  makes them meaningless (`--cont-batching`, `--context-shift`,
  `--swa-full`, ...). Each has the reason shown in `--help`.
- `REJECTED_TABLE`: llama-server flags for features kvmem-server does not offer. They are
  parsed (so the message is ours, not argparse's "unrecognized arguments") and fail before
  the model loads with a message saying why.
"""

from __future__ import annotations

from kvmem.settings import values as t
from kvmem.settings.flag import Flag
from kvmem.settings.flag import noop as N
from kvmem.settings.flag import rejected as R

# fmt: off
NOOP_TABLE: tuple[Flag, ...] = (
    N(("-cb", "--cont-batching", "-nocb", "--no-cont-batching"),
      "no-op: one KVMem session serves one request at a time"),
    N(("--context-shift", "--no-context-shift"),
      "no-op: KVMem keeps the whole history and selects what fits instead of shifting"),
    N(("-bs", "--backend-sampling", "--backend_sampling"),
      "no-op: tokens are sampled by llama.cpp's sampler chain on the CPU, llama-server's own "
      "fallback when the chain cannot run on the backend; the tokens and n_probs are the same"),
    N(("--swa-full",), "no-op: KVMem manages the attention window itself"),
    N(("--cache-prompt", "--no-cache-prompt"),
      "no-op: the session always reuses the matching prefix"),
    N(("--keep",), "no-op: nothing is shifted out of the context, so there is nothing to keep "
      "(KVMem keeps the whole history)", t.int_in_range(-1), metavar="N"),
    N(("--cache-reuse",), "no-op: the session reuses the matching prefix; KV shifting is not "
      "used", t.int_in_range(0), metavar="N"),
    N(("-ctxcp", "--ctx-checkpoints", "--swa-checkpoints"),
      "no-op: KVMem keeps the history in its block store, not in context checkpoints",
      t.int_in_range(0), metavar="N"),
    N(("-sps", "--slot-prompt-similarity"),
      "no-op: a request goes to the lane sharing its longest prefix",
      t.float_in_range(0.0, 1.0), metavar="SIMILARITY"),
    N(("--props",), "no-op: POST /props is not offered (GET /props is read-only)"),
    N(("--sse-ping-interval",), "no-op: streams send no SSE ping comments",
      t.int_in_range(-1), metavar="N"),
    N(("--log-colors",), "no-op: the log has no colors", t.on_off_auto, metavar="on|off|auto",
      optional_value=True),
    N(("--log-prefix", "--no-log-prefix", "--log-timestamps", "--no-log-timestamps"),
      "no-op: every log line has a time, a level and the logger's name"),
    N(("--perf", "--no-perf"), "no-op: timings are always measured (the responses' timings)"),
    N(("-dt", "--defrag-thold"), "no-op: deprecated in llama.cpp (the KV cache is not "
      "defragmented)", t.float_in_range(), metavar="N"),
)

REJECTED_TABLE: tuple[Flag, ...] = (
    R(("-hf", "-hfr", "--hf-repo", "-hff", "--hf-file", "-mu", "--model-url", "-hft",
       "--hf-token"),
      "kvmem-server never downloads models: pass a local file with -m", True),
    R(("--offline",), "kvmem-server never downloads models: pass a local file with -m"),
    R(("--embedding", "--embeddings", "--reranking", "--rerank"),
      "embeddings and reranking are not offered (kvmem-server serves generation only)"),
    R(("--pooling",), "embeddings are not offered, so there is no pooling", True),
    R(("--lora", "--lora-scaled", "--lora-init-without-apply"),
      "LoRA adapters are not supported", True),
    R(("-md", "--model-draft", "--draft", "--draft-max", "--draft-min", "--spec-draft-n-min"),
      "draft models are not supported: use --spec-type ngram-simple", True),
    R(("-gan", "--grp-attn-n", "-gaw", "--grp-attn-w"),
      "group attention (self-extend) is not supported: KVMem extends the context instead", True),
    R(("--models-dir", "--models-max", "--models-preset"),
      "router mode is not supported: one kvmem-server serves one model", True),
    R(("--no-models-autoload",), "router mode is not supported: one kvmem-server serves one model"),
    R(("--tags",), "model tags are not supported", True),
    R(("--sleep-idle-seconds",), "idle sleep is not supported", True),
    R(("--cache-ram",), "the host prompt cache is KVMem's; size it with --kvmem-* flags", True),
    R(("--mmproj-url",), "projectors are not downloaded: pass a local --mmproj file", True),
    R(("--tools", "--tools-runtime", "--mcp-servers-config", "--mcp-servers-json"),
      "built-in tools and MCP servers are not offered: the client executes tools", True),
    R(("--ui-mcp-proxy",), "the MCP proxy is not offered"),
    R(("--rope-scaling", "--rope-scale", "--rope-freq-base", "--rope-freq-scale", "--yarn-orig-ctx"),
      "RoPE overrides are not supported: KVMem places positions itself", True),
    R(("--ssl-key-file", "--ssl-cert-file"),
      "TLS is not supported: put a reverse proxy in front of kvmem-server", True),
)
# fmt: on
