"""Sampling settings: the record shared by chat, server, CLI and the engine's sampler chain."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvmem.settings import Group, setting
from kvmem.settings import values as v


def _sampling(
    default: float,
    names: tuple[str, ...],
    help_text: str,
    parse: Callable[[str], Any],
    env: str | None,
    metavar: str,
) -> Any:
    return setting(
        default, *names, help=help_text, parse=parse, env=env, metavar=metavar,
        group=Group.SAMPLING,
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """llama.cpp sampling settings; temperature <= 0 means greedy. Each field declares
    kvmem-server's flag for its default (kvmem-cli's are in kvmem.cli.cli_flags)."""

    temperature: float = _sampling(
        0.8, ("--temp", "--temperature"), "default temperature, 0 = greedy",
        v.float_in_range(0.0), "LLAMA_ARG_TEMPERATURE", "T",
    )  # fmt: skip
    top_k: int = _sampling(
        40, ("--top-k",), "default top-k, 0 = off", v.int_in_range(0), "LLAMA_ARG_TOP_K", "N"
    )
    top_p: float = _sampling(
        0.95, ("--top-p",), "default top-p", v.float_in_range(0.0, 1.0), "LLAMA_ARG_TOP_P", "P"
    )
    min_p: float = _sampling(
        0.05, ("--min-p",), "default min-p", v.float_in_range(0.0, 1.0), "LLAMA_ARG_MIN_P", "P"
    )
    repeat_penalty: float = _sampling(
        1.0, ("--repeat-penalty",), "default repeat penalty, 1 = off", v.float_in_range(0.0),
        "LLAMA_ARG_REPEAT_PENALTY", "X",
    )  # fmt: skip
    repeat_last_n: int = _sampling(
        64, ("--repeat-last-n",), "tokens the penalties look back over", v.int_in_range(-1),
        None, "N",
    )  # fmt: skip
    presence_penalty: float = _sampling(
        0.0, ("--presence-penalty",), "default presence penalty", v.float_in_range(-2.0, 2.0),
        "LLAMA_ARG_PRESENCE_PENALTY", "X",
    )  # fmt: skip
    frequency_penalty: float = _sampling(
        0.0, ("--frequency-penalty",), "default frequency penalty",
        v.float_in_range(-2.0, 2.0), "LLAMA_ARG_FREQUENCY_PENALTY", "X",
    )  # fmt: skip
    seed: int = _sampling(-1, ("-s", "--seed"), "RNG seed, -1 = random", v.seed, None, "SEED")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0
