"""The resolved kvmem-server configuration (flags + environment + defaults, validated).

Fields that hold a flag's value declare that flag (`setting`: names, parser, environment
variable, help, `--help` group); kvmem.cli.server_config fills the rest (the engine's
settings, the keys, the thinking defaults) and the values it checks (lanes, directories).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import Enum

from kvmem.chat.thinking import ThinkingDefaults
from kvmem.cli.api_keys import ApiKeys
from kvmem.cli.fit_flags import FitPlan
from kvmem.cli.limit_flags import ServerLimits
from kvmem.engine_settings import EngineSettings
from kvmem.sampling import SamplingParams
from kvmem.settings import Group, setting
from kvmem.settings import values as t

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
DEFAULT_QUEUE_SIZE = 16
_SERVER = {"group": Group.SERVER}
_TEMPLATE = {"group": Group.TEMPLATE}


class Source(Enum):
    """Where a setting's value came from (reported in the KVMEM_STARTUP records)."""

    CLI = "cli"
    ENV = "env"
    DEFAULT = "default"


@dataclass(frozen=True, slots=True)
class ServerSettings:
    engine: EngineSettings = field(default_factory=EngineSettings)
    host: str = setting(  # --host split at commas: `hosts`
        DEFAULT_HOST, "--host", help="address(es) to listen on, comma-separated",
        parse=t.host_list, env="LLAMA_ARG_HOST", metavar="HOST", **_SERVER,
    )  # fmt: skip
    port: int = setting(
        DEFAULT_PORT, "--port", help="port to listen on", parse=t.port, env="LLAMA_ARG_PORT",
        metavar="PORT", **_SERVER,
    )  # fmt: skip
    alias: str | None = setting(
        None, "-a", "--alias", help="model name in /v1/models", parse=t.non_empty,
        env="LLAMA_ARG_ALIAS", metavar="NAME", shown="the model file name", group=Group.MODEL,
    )  # fmt: skip
    api_keys: ApiKeys = field(default_factory=ApiKeys)
    n_predict: int = setting(  # a request's output limit when it sets none; -1: the context
        -1, "-n", "--n-predict", "--predict",
        help="tokens per response of a request that sets no n_predict/max_tokens (a "
        "request's own limit wins), -1 = until the context is full",
        parse=t.n_predict, env="LLAMA_ARG_N_PREDICT", metavar="N", group=Group.SAMPLING,
    )  # fmt: skip
    tool_max_tokens: int = setting(  # output cap of a tools request without max_tokens
        2048, "--tool-max-tokens",
        help="max tokens per response of a request with tools that sets no max_tokens, -1 = "
        "no cap (a client's max_tokens wins; with -n too, the smaller)",
        parse=t.n_predict, metavar="N", group=Group.SAMPLING,
    )  # fmt: skip
    sampling: SamplingParams = field(default_factory=SamplingParams)  # per-request defaults
    chat_template: str | None = None  # Jinja source overriding the GGUF's
    chat_template_origin: str = "gguf"  # gguf | --chat-template | the template file's path
    thinking: ThinkingDefaults = field(default_factory=ThinkingDefaults)
    budget_message: str = setting(
        "", "--reasoning-budget-message",
        help="text inserted before the end-of-thinking tag when the budget runs out",
        parse=str, env="LLAMA_ARG_THINK_BUDGET_MESSAGE", metavar="TEXT", shown="none",
        dest="reasoning_budget_message", **_TEMPLATE,
    )  # fmt: skip
    ui: bool = setting(
        True, "--ui", "--webui", help="serve the browser chat page at /", env="LLAMA_ARG_UI",
        negative=("--no-ui", "--no-webui"), group=Group.UI,
    )  # fmt: skip
    ui_dir: str | None = setting(  # None: the packaged page (kvmem/ui/static), when present
        None, "--ui-dir", "--path",
        help="directory of the chat page to serve (must hold index.html)", parse=t.non_empty,
        env="LLAMA_ARG_STATIC_PATH", metavar="PATH", shown="the packaged page", group=Group.UI,
    )  # fmt: skip
    metrics: bool = setting(
        False, "--metrics", help="enable the Prometheus /metrics endpoint",
        env="LLAMA_ARG_ENDPOINT_METRICS", **_SERVER,
    )  # fmt: skip
    queue_size: int = setting(
        DEFAULT_QUEUE_SIZE, "--queue-size", help="requests that may wait for the slot before 503",
        parse=t.int_in_range(0, 4096), metavar="N", **_SERVER,
    )  # fmt: skip
    parallel: int = setting(  # lanes, each its own context and KVMem session
        1, "-np", "--parallel",
        help="lanes (1-4): concurrent generations, each its own context and KVMem window; "
        "each lane's logical context is -c / N (-c shared with --kv-unified)",
        parse=t.parallel_slots, env="LLAMA_ARG_N_PARALLEL", metavar="N", **_SERVER,
    )  # fmt: skip
    kv_unified: bool = setting(  # the lanes share one logical context of -c tokens
        False, "-kvu", "--kv-unified",
        help="the lanes share one logical context of -c tokens (each may use up to -c while "
        "the running requests together hold at most -c) instead of -c / N each; each lane's "
        "context is then sized for -c (N x the KV cells)",
        env="LLAMA_ARG_KV_UNIFIED", negative=("-no-kvu", "--no-kv-unified"), **_SERVER,
    )  # fmt: skip
    verbosity: int = setting(
        3, "-lv", "--verbosity", "--log-verbosity",
        help="log level: 0 silent, 1 errors, 2 warnings, 3 info, 4 + llama.cpp's log, 5 debug",
        parse=t.verbosity, env="LLAMA_ARG_LOG_VERBOSITY", metavar="N", group=Group.LOG,
    )  # fmt: skip
    log_file: str | None = setting(  # the log goes there too
        None, "--log-file", help="also write the log to this file (appended)",
        parse=t.non_empty, env="LLAMA_ARG_LOG_FILE", metavar="FNAME",
        shown="none: stderr only", group=Group.LOG,
    )  # fmt: skip
    reuse_port: bool = setting(  # SO_REUSEPORT on the listening sockets
        False, "--reuse-port", help="let other sockets bind the same port (SO_REUSEPORT)",
        env="LLAMA_ARG_REUSE_PORT", **_SERVER,
    )  # fmt: skip
    slots_endpoint: bool = setting(
        True, "--slots", help="expose GET /slots (501 without)", env="LLAMA_ARG_ENDPOINT_SLOTS",
        negative=("--no-slots",), dest="slots", **_SERVER,
    )  # fmt: skip
    reasoning_format: str = setting(  # none | auto | deepseek | deepseek-legacy
        "auto", "--reasoning-format",
        help="where thinking goes: none (in content) or auto/deepseek (reasoning_content)",
        parse=t.reasoning_format, env="LLAMA_ARG_REASONING_FORMAT", metavar="FORMAT",
        **_TEMPLATE,
    )  # fmt: skip
    trace: bool = False
    mmproj: str | None = None  # -mm/--mmproj (the engine's vision settings have it too)
    media_path: str | None = None  # the directory file:// image URLs may name
    sources: Mapping[str, Source] = field(default_factory=dict)
    limits: ServerLimits = field(default_factory=ServerLimits)  # body/timeouts/connections/CORS
    fit: FitPlan | None = None  # --fit on: the window's sizing (kvmem.cli.fit_flags)
    slot_save_path: str | None = setting(  # an existing directory
        None, "--slot-save-path",
        help="directory for POST /slots/0?action=save|restore files (the KVMem session's "
        "history)", parse=t.non_empty, env="LLAMA_ARG_SLOT_SAVE_PATH", metavar="PATH",
        shown="none: slot actions answer 501", **_SERVER,
    )  # fmt: skip

    @property
    def hosts(self) -> tuple[str, ...]:
        """--host split at commas: every address is bound on --port."""
        return tuple(h.strip() for h in self.host.split(",") if h.strip())

    def with_model_path(self, path: str) -> ServerSettings:
        return replace(self, engine=replace(self.engine, model_path=path))
