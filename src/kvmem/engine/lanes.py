"""`--parallel N` lanes: N engines over one model's weights.

The weights load once (one `llama_model`); every lane is an `Engine` with its own
llama.cpp context of budget + reserve cells, its own KVMem session (block table, host
store, retrieval index, GPU window) and, with `--kvmem-conversations`, its own pool of
conversations. As llama-server divides `-c` among its slots, each lane's logical context is
`-c / N`. A lane's context is used by one thread at a time (the server's lane
thread); lanes never share a context, so their generations run concurrently and their
KV never mixes. `Engine` alone stays the N = 1 API of the CLI and the benchmarks.

With `--kvmem-disk-dir DIR` each lane has its own store, as llama-server's slots each
have their own saved state: lane 0's is DIR itself (the layout of `--parallel 1`, so a
store made without lanes is lane 0's), lane k's is DIR/lane-<k>. Every lane persists its
conversation(s) after each turn and loads them at start; the server routes a request to
the free lane whose (restored) history shares the longest prefix with it, so after a
restart each conversation resumes, with cached tokens, on the lane that stored it.
With `unified` (`--kv-unified`) every lane's logical context is the whole `-c`, sized so
(N x min(budget + reserve, -c) cells); the server's SharedContextPool
(kvmem.server.context_pool) then keeps the running requests together within `-c`.
"""

from __future__ import annotations

import logging
from dataclasses import fields, replace

import llama_cpp

from kvmem.config import lane_disk_dir
from kvmem.engine_settings import MAX_LANES, EngineSettings
from kvmem.errors import ConfigError
from kvmem.gguf.model_path import resolve_model_path

from .engine import Engine
from .llama.model import LlamaModel, ModelInfo
from .trace import EngineStats

logger = logging.getLogger(__name__)


class EngineLanes:
    """N lanes (`Engine`s) sharing one `LlamaModel`; closes them, then the model."""

    def __init__(
        self, settings: EngineSettings, n: int, trace_stream=None, *, unified: bool = False
    ) -> None:
        if not 1 <= n <= MAX_LANES:
            raise ConfigError("--parallel", f"must be between 1 and {MAX_LANES}, got {n}")
        settings.validate()
        path = resolve_model_path(settings.model_path)
        self.model = LlamaModel(
            path,
            settings.n_gpu_layers,
            settings.placement,
            load_mtp=settings.spec.wants_mtp,
            load_mode=settings.load_mode,
        )
        if n > 1 and not unified:  # as llama-server's slots: each lane's context is -c / N
            total = settings.n_ctx or llama_cpp.llama_model_n_ctx_train(self.model.ptr)
            settings = replace(settings, n_ctx=max(1, total // n))
        self.lanes: list[Engine] = []
        try:
            for k in range(n):
                lane = lane_settings(settings, k)
                self.lanes.append(Engine(lane, trace_stream, model=self.model))
        except BaseException:
            self.close()
            raise
        logger.info(
            "%d lanes on one model: %d GPU cells in all",
            n,
            sum(e.session.capacity for e in self.lanes),
        )

    @property
    def info(self) -> ModelInfo:
        return self.lanes[0].info

    @property
    def stats(self) -> EngineStats:
        """The lanes' counters and gauges summed (cells: N x (budget + reserve))."""
        return combined_stats([e.stats for e in self.lanes])

    def tier_gauges(self) -> dict[str, int]:
        """The lanes' disk-tier figures now (`Engine.tier_gauges`): summed, except that
        `tier_degraded` is 1 when any lane's tier stopped writing."""
        total: dict[str, int] = {}
        for lane in self.lanes:
            for name, value in lane.tier_gauges().items():
                total[name] = total.get(name, 0) + value
        if "tier_degraded" in total:
            total["tier_degraded"] = min(1, total["tier_degraded"])
        return total

    # text (the shared vocabulary: any lane answers, from any thread) --------------------
    def tokenize(
        self, text: str, *, add_special: bool = False, parse_special: bool = True
    ) -> list[int]:
        return self.lanes[0].tokenize(text, add_special=add_special, parse_special=parse_special)

    def token_bytes(self, token: int) -> bytes:
        return self.lanes[0].token_bytes(token)

    def detokenize(self, tokens) -> str:
        return self.lanes[0].detokenize(tokens)

    def eog_tokens(self) -> tuple[int, ...]:
        return self.lanes[0].eog_tokens()

    def is_eog(self, token: int) -> bool:
        return self.lanes[0].is_eog(token)

    def check_grammar(self, grammar: str) -> None:
        self.lanes[0].check_grammar(grammar)

    def window_tiers(self) -> dict[str, list[int]]:
        return self.lanes[0].window_tiers()

    def close(self) -> None:
        for engine in self.lanes:
            engine.close()
        self.lanes = []
        self.model.close()


def lane_settings(settings: EngineSettings, lane: int) -> EngineSettings:
    """Lane `lane`'s settings: its own store under --kvmem-disk-dir (lane 0: DIR itself)."""
    disk_dir = lane_disk_dir(settings.kvmem.disk_dir, lane)
    if disk_dir == settings.kvmem.disk_dir:
        return settings
    return replace(settings, kvmem=replace(settings.kvmem, disk_dir=disk_dir))


def combined_stats(parts: list[EngineStats]) -> EngineStats:
    total = EngineStats()
    for f in fields(EngineStats):
        setattr(total, f.name, sum(getattr(p, f.name) for p in parts))
    return total
