"""kvmem-server's own rows of the flag table: llama-server's model, sampling, template,
vision, GPU and logging flags with their meanings. The network side (listening, limits,
CORS, keys, the page) is in kvmem.cli.flag_table_network.

Each row is a `Flag` (kvmem.cli.flag_spec); the parser, the `LLAMA_ARG_*` bindings,
`--help` and docs/server.md's flag table are generated from them (kvmem.cli.flag_parser).
"""

from __future__ import annotations

from kvmem.cli import arg_types as t
from kvmem.cli.flag_spec import Flag
from kvmem.cli.flag_spec import Group as G
from kvmem.cli.flag_spec import Program as P

F = Flag
LOAD_MODE_NAMES = ("auto", "none", "mmap", "mlock", "mmap+mlock", "dio")  # llama.cpp's -lm
# fmt: off
MODEL_TABLE: tuple[Flag, ...] = (
    F(("-m", "--model"), "model", "GGUF model file or a model name (qwen-0.5b)", t.non_empty, None, "LLAMA_ARG_MODEL",
      metavar="FNAME", programs=P.BOTH, shown_default="the embedded SmolLM2-135M-Instruct", group=G.MODEL),
    F(("-a", "--alias"), "alias", "model name in /v1/models", t.non_empty, None, "LLAMA_ARG_ALIAS",
      metavar="NAME", shown_default="the model file name", group=G.MODEL),
    F(("-c", "--ctx-size"), "ctx_size", "logical context size in tokens (positive)", t.ctx_size, None,
      "LLAMA_ARG_CTX_SIZE", metavar="N", shown_default="the model's training context", group=G.MODEL),
    F(("-t", "--threads"), "threads", "CPU threads for generation (1-512), -1 = auto", t.threads, -1,
      "LLAMA_ARG_THREADS", metavar="N", group=G.MODEL),
    F(("-tb", "--threads-batch"), "threads_batch", "CPU threads for prompt processing (1-512), -1 = auto",
      t.threads, -1, metavar="N", shown_default="same as --threads", group=G.MODEL),
    F(("-b", "--batch-size"), "batch_size", "logical batch size", t.positive_int, 2048,
      "LLAMA_ARG_BATCH", metavar="N", group=G.MODEL),
    F(("-ub", "--ubatch-size"), "ubatch_size", "physical batch size (clamped to -b)", t.positive_int, 512,
      "LLAMA_ARG_UBATCH", metavar="N", group=G.MODEL),
    F(("-fa", "--flash-attn"), "flash_attn", "flash attention: on, off or auto", t.flash_attn,
      t.FlashAttn.AUTO, "LLAMA_ARG_FLASH_ATTN", metavar="on|off|auto", shown_default="auto (= on)",
      group=G.MODEL),
    F(("-ngl", "--gpu-layers", "--n-gpu-layers"), "gpu_layers", "layers on the GPU: N, all or auto",
      t.gpu_layers, -1, "LLAMA_ARG_N_GPU_LAYERS", metavar="N", shown_default="all", group=G.MODEL),
    F(("-lm", "--load-mode"), "load_mode",
      "how the weights load: auto (mmap unless a device cannot), none (read), mmap, mlock "
      "(read and locked in RAM), mmap+mlock or dio (direct I/O)", str, "auto",
      "LLAMA_ARG_LOAD_MODE", metavar="MODE", choices=LOAD_MODE_NAMES, group=G.MODEL),
    F(("--mlock",), "mlock", "keep the weights in RAM, never swapped out (= -lm mmap+mlock, "
      "or mlock with --no-mmap)", None, False, "LLAMA_ARG_MLOCK", group=G.MODEL),
    F(("--mmap",), "mmap", "map the model file (= -lm mmap); --no-mmap reads it (= -lm none)",
      None, None, "LLAMA_ARG_MMAP", negative=("--no-mmap",), shown_default="auto",
      group=G.MODEL),
)

SAMPLING_TABLE: tuple[Flag, ...] = (
    F(("-n", "--n-predict", "--predict"), "n_predict", "max tokens per response, -1 = no cap",
      t.n_predict, -1, "LLAMA_ARG_N_PREDICT", metavar="N", group=G.SAMPLING),
    F(("--tool-max-tokens",), "tool_max_tokens",
      "max tokens per response of a request with tools that sets no max_tokens, -1 = no cap "
      "(a client's max_tokens wins; -n still caps)",
      t.n_predict, 2048, metavar="N", group=G.SAMPLING),
    F(("-s", "--seed"), "seed", "RNG seed, -1 = random", t.seed, -1, metavar="SEED", group=G.SAMPLING),
    F(("--temp", "--temperature"), "temperature", "default temperature, 0 = greedy",
      t.float_in_range(0.0), 0.8, "LLAMA_ARG_TEMPERATURE", metavar="T", group=G.SAMPLING),
    F(("--top-k",), "top_k", "default top-k, 0 = off", t.int_in_range(0), 40, "LLAMA_ARG_TOP_K",
      metavar="N", group=G.SAMPLING),
    F(("--top-p",), "top_p", "default top-p", t.float_in_range(0.0, 1.0), 0.95, "LLAMA_ARG_TOP_P",
      metavar="P", group=G.SAMPLING),
    F(("--min-p",), "min_p", "default min-p", t.float_in_range(0.0, 1.0), 0.05, "LLAMA_ARG_MIN_P",
      metavar="P", group=G.SAMPLING),
    F(("--repeat-penalty",), "repeat_penalty", "default repeat penalty, 1 = off",
      t.float_in_range(0.0), 1.0, "LLAMA_ARG_REPEAT_PENALTY", metavar="X", group=G.SAMPLING),
    F(("--repeat-last-n",), "repeat_last_n", "tokens the penalties look back over",
      t.int_in_range(-1), 64, metavar="N", group=G.SAMPLING),
    F(("--presence-penalty",), "presence_penalty", "default presence penalty",
      t.float_in_range(-2.0, 2.0), 0.0, "LLAMA_ARG_PRESENCE_PENALTY", metavar="X", group=G.SAMPLING),
    F(("--frequency-penalty",), "frequency_penalty", "default frequency penalty",
      t.float_in_range(-2.0, 2.0), 0.0, "LLAMA_ARG_FREQUENCY_PENALTY", metavar="X", group=G.SAMPLING),
)

TEMPLATE_TABLE: tuple[Flag, ...] = (
    F(("--chat-template",), "chat_template", "Jinja chat template (inline source or 'chatml')",
      t.non_empty, None, "LLAMA_ARG_CHAT_TEMPLATE", metavar="JINJA", shown_default="the GGUF's",
      group=G.TEMPLATE),
    F(("--chat-template-file",), "chat_template_file", "file holding a Jinja chat template",
      t.non_empty, None, "LLAMA_ARG_CHAT_TEMPLATE_FILE", metavar="FNAME", shown_default="none",
      group=G.TEMPLATE),
    F(("--chat-template-kwargs",), "chat_template_kwargs", "JSON object of extra template variables",
      t.json_object, None, "LLAMA_ARG_CHAT_TEMPLATE_KWARGS", metavar="JSON", shown_default="{}",
      group=G.TEMPLATE),
    F(("--jinja",), "jinja", "use Jinja templates (always on; --no-jinja warns)", None, True, "LLAMA_ARG_JINJA",
      negative=("--no-jinja",), group=G.TEMPLATE),
    F(("--reasoning-format",), "reasoning_format",
      "where thinking goes: none (in content) or auto/deepseek (reasoning_content)",
      t.reasoning_format, "auto", "LLAMA_ARG_REASONING_FORMAT", metavar="FORMAT", group=G.TEMPLATE),
    F(("--reasoning-effort",), "reasoning_effort", "default reasoning effort given to the template",
      t.effort_level, "default", "LLAMA_ARG_REASONING_EFFORT", metavar="LEVEL", group=G.TEMPLATE),
    F(("--enable-thinking",), "enable_thinking", "set enable_thinking=true for the template", None,
      None, shown_default="the template's", group=G.TEMPLATE),
    F(("-rea", "--reasoning"), "reasoning", "thinking: on, off or auto", t.reasoning_switch, None,
      "LLAMA_ARG_REASONING", metavar="on|off|auto", shown_default="auto", group=G.TEMPLATE),
    F(("--reasoning-budget",), "reasoning_budget",
      "thinking token budget: -1 unlimited, 0 none, N tokens", t.reasoning_budget, -1,
      "LLAMA_ARG_THINK_BUDGET", metavar="N", group=G.TEMPLATE),
    F(("--reasoning-budget-message",), "reasoning_budget_message",
      "text inserted before the end-of-thinking tag when the budget runs out", str, "",
      "LLAMA_ARG_THINK_BUDGET_MESSAGE", metavar="TEXT", shown_default="none", group=G.TEMPLATE),
)

VISION_TABLE: tuple[Flag, ...] = (
    F(("-mm", "--mmproj"), "mmproj", "multimodal projector GGUF", t.non_empty, None,
      "LLAMA_ARG_MMPROJ", metavar="FNAME", shown_default="none", group=G.VISION),
    F(("--mmproj-offload",), "mmproj_offload", "offload the projector to the GPU", None, True,
      "LLAMA_ARG_MMPROJ_OFFLOAD", negative=("--no-mmproj-offload",), group=G.VISION),
    F(("--image-max-tokens",), "image_max_tokens", "max tokens per image", t.positive_int, None,
      "LLAMA_ARG_IMAGE_MAX_TOKENS", metavar="N", shown_default="the projector's", group=G.VISION),
    F(("--image-min-tokens",), "image_min_tokens", "min tokens per image", t.positive_int, None,
      "LLAMA_ARG_IMAGE_MIN_TOKENS", metavar="N", shown_default="the projector's", group=G.VISION),
    F(("--media-path",), "media_path", "directory file:// image URLs may be read from",
      t.non_empty, None, "LLAMA_ARG_MEDIA_PATH", metavar="DIR", shown_default="none", group=G.VISION),
)

GPU_TABLE: tuple[Flag, ...] = (
    F(("-dev", "--device"), "device", "the one device: none (CPU) or NAME<i>, e.g. CUDA0 (= -sm none -mg i)", t.device_list, (),
      "LLAMA_ARG_DEVICE", metavar="DEV", shown_default="automatic", group=G.GPU),
    F(("-sm", "--split-mode"), "split_mode", "llama.cpp split mode: none or layer (one GPU only)", t.split_mode,
      t.SplitMode.LAYER, "LLAMA_ARG_SPLIT_MODE", metavar="MODE", group=G.GPU),
    F(("-mg", "--main-gpu"), "main_gpu", "llama.cpp main GPU: the GPU used with -sm none", t.int_in_range(0), 0,
      "LLAMA_ARG_MAIN_GPU", metavar="INDEX", group=G.GPU),
    F(("-ts", "--tensor-split"), "tensor_split", "llama.cpp tensor split: proportions, at most one non-zero (one GPU only)", t.tensor_split, (),
      "LLAMA_ARG_TENSOR_SPLIT", metavar="N0", shown_default="none", group=G.GPU),
    F(("--rpc",), "rpc", "RPC workers (kvmem-rpc-worker) whose devices join the layer split, before the local GPUs; no authentication: trusted networks only", t.rpc_workers, (),
      "LLAMA_ARG_RPC", metavar="HOST:PORT,...", shown_default="none", programs=P.BOTH, group=G.GPU),
)

LOG_TABLE: tuple[Flag, ...] = (
    F(("-v", "--verbose", "--log-verbose"), "verbose", "log everything (-lv 5 unless -lv is given) and add __verbose to chat responses", None,
      False, group=G.LOG),
    F(("-lv", "--verbosity", "--log-verbosity"), "verbosity",
      "log level: 0 silent, 1 errors, 2 warnings, 3 info, 4 + llama.cpp's log, 5 debug", t.verbosity, 3,
      "LLAMA_ARG_LOG_VERBOSITY", metavar="N", group=G.LOG),
    F(("--log-disable",), "log_disable", "no log at all (as -lv 0)", None, False, group=G.LOG),
    F(("--log-file",), "log_file", "also write the log to this file (appended)", t.non_empty, None,
      "LLAMA_ARG_LOG_FILE", metavar="FNAME", shown_default="none: stderr only", group=G.LOG),
)
# fmt: on

SERVER_TABLE: tuple[Flag, ...] = (
    MODEL_TABLE + SAMPLING_TABLE + TEMPLATE_TABLE + VISION_TABLE + GPU_TABLE + LOG_TABLE
)
