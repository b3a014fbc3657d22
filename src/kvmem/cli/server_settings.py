"""The resolved kvmem-server configuration (flags + environment + defaults, validated)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import Enum

from kvmem.chat.thinking import ThinkingDefaults
from kvmem.cli.api_keys import ApiKeys
from kvmem.cli.limit_flags import ServerLimits
from kvmem.engine.settings import EngineSettings
from kvmem.sampling import SamplingParams

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
DEFAULT_QUEUE_SIZE = 16


class Source(Enum):
    """Where a setting's value came from (reported in the KVMEM_STARTUP records)."""

    CLI = "cli"
    ENV = "env"
    DEFAULT = "default"


@dataclass(frozen=True, slots=True)
class ServerSettings:
    engine: EngineSettings = field(default_factory=EngineSettings)
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    alias: str | None = None
    api_keys: ApiKeys = field(default_factory=ApiKeys)
    n_predict: int = -1  # server-wide output cap; -1: none
    tool_max_tokens: int = 2048  # output cap of a tools request without max_tokens; -1: none
    sampling: SamplingParams = field(default_factory=SamplingParams)  # per-request defaults
    chat_template: str | None = None  # Jinja source overriding the GGUF's
    chat_template_origin: str = "gguf"  # gguf | --chat-template | the template file's path
    thinking: ThinkingDefaults = field(default_factory=ThinkingDefaults)
    budget_message: str = ""
    ui: bool = True
    ui_dir: str | None = None  # None: the packaged page (kvmem/ui/static), when present
    metrics: bool = False
    queue_size: int = DEFAULT_QUEUE_SIZE
    parallel: int = 1  # --parallel: lanes, each its own context and KVMem session
    verbosity: int = 3
    log_file: str | None = None  # --log-file: the log goes there too
    reuse_port: bool = False  # --reuse-port: SO_REUSEPORT on the listening sockets
    slots_endpoint: bool = True  # --slots / --no-slots
    reasoning_format: str = "auto"  # --reasoning-format: none | auto | deepseek | deepseek-legacy
    trace: bool = False
    mmproj: str | None = None
    mmproj_offload: bool = True
    image_max_tokens: int | None = None
    image_min_tokens: int | None = None  # vision (issue 12)
    media_path: str | None = None  # the directory file:// image URLs may name
    devices: tuple[str, ...] = ()
    split_mode: str = "layer"
    main_gpu: int = 0
    tensor_split: tuple[float, ...] = ()
    sources: Mapping[str, Source] = field(default_factory=dict)
    limits: ServerLimits = field(default_factory=ServerLimits)  # body/timeouts/connections/CORS
    slot_save_path: str | None = None  # --slot-save-path: an existing directory

    @property
    def hosts(self) -> tuple[str, ...]:
        """--host split at commas: every address is bound on --port."""
        return tuple(h.strip() for h in self.host.split(",") if h.strip())

    def with_model_path(self, path: str) -> ServerSettings:
        return replace(self, engine=replace(self.engine, model_path=path))
