"""Value parsers for llama-server-style flags and their `LLAMA_ARG_*` environment values.

Each parser takes the text of one value and returns the parsed value or raises
`argparse.ArgumentTypeError` with a message that names the accepted values.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from enum import Enum
from typing import Any

_TRUE = ("1", "true", "on", "yes", "enabled")
_FALSE = ("0", "false", "off", "no", "disabled")


class FlashAttn(Enum):
    ON = "on"
    OFF = "off"
    AUTO = "auto"


class SplitMode(Enum):
    NONE = "none"
    LAYER = "layer"
    ROW = "row"
    TENSOR = "tensor"


def strict_int(text: str) -> int:
    """An integer in plain decimal; rejects '1.5', '1e3', '' and trailing garbage."""
    value = text.strip()
    if not value or not value.lstrip("+-").isdigit():
        raise argparse.ArgumentTypeError(f"invalid integer value: {text!r}")
    return int(value)


def strict_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number: {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"invalid number: {text!r}")
    return value


def parse_bool(text: str) -> bool:
    """1/0, true/false, on/off, yes/no (any case)."""
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise argparse.ArgumentTypeError(
        f"invalid boolean {text!r}: use 1/0, true/false, on/off or yes/no"
    )


INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1  # llama.cpp keeps most numbers as int32_t


def int_in_range(
    lo: int | None = None, hi: int | None = None, *, also: tuple[int, ...] = ()
) -> Callable[[str], int]:
    """An integer in [lo, hi], or one of `also`. An open end (None) is int32's end: llama.cpp
    stores these values as int32_t, so a larger one would overflow there."""
    low = INT32_MIN if lo is None else lo
    high = INT32_MAX if hi is None else hi

    def parse(text: str) -> int:
        value = strict_int(text)
        if value in also:
            return value
        if value < low or value > high:
            extra = f" or {', '.join(map(str, also))}" if also else ""
            raise argparse.ArgumentTypeError(
                f"{value} is out of range: must be in {low}..{high}{extra}"
            )
        return value

    return parse


int32 = int_in_range()


def float_in_range(lo: float | None = None, hi: float | None = None) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = strict_float(text)
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"{value} is out of range [{lo}, {hi}]")
        return value

    return parse


MAX_THREADS = 512  # GGML_MAX_N_THREADS

positive_int = int_in_range(1)
ctx_size = int_in_range(1)  # positions are llama_pos (int32)
n_predict = int_in_range(1, also=(-1,))
threads = int_in_range(1, MAX_THREADS, also=(-1,))
threads_http = int_in_range(1, 1024, also=(-1, 0))  # -1 and 0: automatic
port = int_in_range(1, 65535)
verbosity = int_in_range(0, 5)
reasoning_budget = int_in_range(-1)
seed = int_in_range(-1, 2**32 - 1)


def gpu_layers(text: str) -> int:
    """N >= 0, 'all' or 'auto' (both -1: every layer)."""
    value = text.strip().lower()
    if value in ("all", "auto"):
        return -1
    return int_in_range(0)(text)


def flash_attn(text: str) -> FlashAttn:
    value = text.strip().lower()
    if value in ("auto",):
        return FlashAttn.AUTO
    try:
        return FlashAttn.ON if parse_bool(value) else FlashAttn.OFF
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: use on, off or auto") from None


def split_mode(text: str) -> SplitMode:
    try:
        return SplitMode(text.strip().lower())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid split mode {text!r}: use none, layer, row or tensor"
        ) from None


def device_list(text: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in text.split(","))
    if not all(names):
        raise argparse.ArgumentTypeError(f"invalid device list {text!r}")
    return names


def tensor_split(text: str) -> tuple[float, ...]:
    parts = [p for p in text.replace("/", ",").split(",")]
    try:
        values = tuple(strict_float(p) for p in parts)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"invalid tensor split {text!r}: use proportions like 3,1"
        ) from None
    if any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"invalid tensor split {text!r}: proportions must be >= 0")
    return values


def json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"invalid JSON: {exc.msg} at position {exc.pos}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(
            "must be a JSON object, e.g. '{\"enable_thinking\": true}'"
        )
    if "enable_thinking" in value and not isinstance(value["enable_thinking"], bool):
        raise argparse.ArgumentTypeError("enable_thinking must be a JSON boolean (true or false)")
    return value


def reasoning_switch(text: str) -> bool | None:
    """on/off/auto -> True/False/None."""
    value = text.strip().lower()
    if value == "auto":
        return None
    try:
        return parse_bool(value)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: use on, off or auto") from None


def effort_level(text: str) -> str:
    value = text.strip().lower()
    allowed = ("default", "none", "minimal", "low", "medium", "high", "xhigh", "max")
    if value not in allowed:
        raise argparse.ArgumentTypeError(
            f"invalid reasoning effort {text!r}: use one of {', '.join(allowed)}"
        )
    return value


def non_empty(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


REASONING_FORMATS = ("none", "auto", "deepseek")


def reasoning_format(text: str) -> str:
    """--reasoning-format: none (thinking stays in content, tags included) or auto/deepseek
    (thinking goes to reasoning_content). deepseek-legacy (both at once) is not offered."""
    value = text.strip().lower()
    if value == "deepseek-legacy":
        raise argparse.ArgumentTypeError(
            "'deepseek-legacy' (thinking in both content and reasoning_content) is not "
            "supported: use deepseek or none"
        )
    if value not in REASONING_FORMATS:
        raise argparse.ArgumentTypeError(
            f"invalid reasoning format {text!r}: use one of {', '.join(REASONING_FORMATS)}"
        )
    return value


def host_list(text: str) -> str:
    """--host: one address or a comma-separated list (each is bound on --port)."""
    parts = [p.strip() for p in text.split(",")]
    if not all(parts):
        raise argparse.ArgumentTypeError(f"invalid host list {text!r}: an address is empty")
    return ",".join(parts)


parallel_slots = int_in_range(1, also=(-1,))  # -1: auto (one lane); the lane cap is checked later


_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an HTTP token (RFC 9110)


def token_list(text: str) -> tuple[str, ...]:
    """A comma list of HTTP methods or header names (`GET, POST`), or `*`."""
    items = tuple(item.strip() for item in text.split(","))
    if not all(items) or not all(_TOKEN.match(item) for item in items):
        raise argparse.ArgumentTypeError(
            f"invalid list {text!r}: give comma-separated names, e.g. 'GET, POST' or '*'"
        )
    return items


def on_off_auto(text: str) -> str:
    value = text.strip().lower()
    if value not in ("on", "off", "auto"):
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: use on, off or auto")
    return value


def layer_list(text: str) -> tuple[int, ...]:
    if text.strip().lower() in ("", "all"):
        return ()
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid layer list: {text!r}") from None


def rpc_workers(text: str) -> tuple[Any, ...]:
    """`--rpc HOST:PORT[,HOST:PORT...]` -> RpcEndpoint records (kvmem.settings.rpc_endpoints)."""
    from kvmem.errors import ConfigError
    from kvmem.settings.rpc_endpoints import parse_endpoints

    try:
        return parse_endpoints(text, flag="")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
