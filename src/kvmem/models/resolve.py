"""`-m NAME`: a model name from the catalog becomes the path of its joined GGUF."""

from __future__ import annotations

import os

from kvmem.errors import ConfigError, ModelNotFoundError

from .assemble import ensure_model
from .catalog import lookup, model_names


def resolve_model_arg(value: str | None) -> str | None:
    """`value` unchanged when it is None or an existing path (or unknown, left for the
    caller's file check); the cached GGUF's path when it names a catalog model.

    Joins the parts on first use; ModelNotFoundError names a missing or corrupt package.
    """
    if value is None or os.path.exists(value):
        return value
    model = lookup(value)
    if model is None:
        return value
    return str(ensure_model(model))


def looks_like_name(value: str) -> bool:
    """A bare word such as `qwen-0.6b`: no directory part and no `.gguf` suffix."""
    return os.sep not in value and "/" not in value and not value.lower().endswith(".gguf")


def check_model_value(value: str, flag: str) -> None:
    """ConfigError for a value that cannot be a model file: a directory, or an unknown
    model name (the message lists the names there are)."""
    if os.path.isdir(value):
        raise ConfigError(flag, f"{value} is a directory: give a GGUF file or a model name")
    if not os.path.exists(value) and looks_like_name(value):
        raise ConfigError(
            flag,
            f"no model file or model name {value!r}: give a GGUF file path or one of the "
            f"model names: {', '.join(model_names())}",
        )


def resolve_model_flag(value: str | None, flag: str) -> str | None:
    """`resolve_model_arg` for a command-line flag: problems become a ConfigError on `flag`
    (a directory, an unknown name, a missing or corrupt package)."""
    try:
        resolved = resolve_model_arg(value)
    except ModelNotFoundError as exc:
        raise ConfigError(flag, str(exc)) from None
    if resolved is not None:
        check_model_value(resolved, flag)
    return resolved
