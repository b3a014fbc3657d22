"""`-m NAME`: a model name from the catalog becomes the path of its joined GGUF."""

from __future__ import annotations

import os

from kvmem.errors import ConfigError, ModelNotFoundError

from .assemble import ensure_model
from .catalog import lookup


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


def resolve_model_flag(value: str | None, flag: str) -> str | None:
    """`resolve_model_arg` for a command-line flag: problems become a ConfigError on `flag`."""
    try:
        return resolve_model_arg(value)
    except ModelNotFoundError as exc:
        raise ConfigError(flag, str(exc)) from None
