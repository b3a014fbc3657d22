"""`LLAMA_ARG_*` environment variables: names, validation and the unknown-name policy.

- A supported variable is parsed by the same parser as its flag; an invalid value fails
  (even when the command line overrides it), naming the variable but not echoing values
  of secret variables.
- Boolean flags also honour llama.cpp's negated form: `LLAMA_ARG_NO_<NAME>` set = false.
- Unknown `LLAMA_ARG_*` names only warn, and the warning shows the name, never the value.
- API-key and TLS variables that kvmem-server does not support fail startup, so that
  authentication or TLS is never silently left unconfigured.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kvmem.errors import ConfigError
from kvmem.settings.values import parse_bool

SECRET_ENV = frozenset({"LLAMA_API_KEY", "LLAMA_ARG_API_KEY"})
_SECURITY_WORDS = ("API_KEY", "SSL", "TLS", "CERT")
_PREFIXES = ("LLAMA_ARG_", "LLAMA_API_")


@dataclass(frozen=True, slots=True)
class EnvBinding:
    """One flag's environment variable."""

    name: str  # e.g. LLAMA_ARG_CTX_SIZE
    dest: str  # the argparse destination it sets
    parse: Callable[[str], Any] | None  # None: a boolean switch
    negatable: bool = False  # LLAMA_ARG_NO_<NAME> also recognised


class _Missing:
    __slots__ = ()


MISSING: Any = _Missing()


def check_env_names(environ: Mapping[str, str], supported: set[str]) -> list[str]:
    """Warnings for unknown `LLAMA_ARG_*` names; ConfigError for unsupported key/TLS names."""
    warnings = []
    for name in sorted(environ):
        if not name.startswith(_PREFIXES) or name in supported:
            continue
        if any(word in name for word in _SECURITY_WORDS):
            raise ConfigError(
                name,
                "this API-key/TLS environment variable is not supported by kvmem-server; unset it "
                "(keys: LLAMA_API_KEY, LLAMA_ARG_API_KEY_FILE; native TLS is not available)",
            )
        if name.startswith("LLAMA_ARG_"):
            warnings.append(f"ignoring unsupported environment variable {name}")
    return warnings


def read_env_value(binding: EnvBinding, environ: Mapping[str, str]) -> Any:
    """The parsed value of `binding` in `environ`, or MISSING; ConfigError when invalid."""
    negated = "LLAMA_ARG_NO_" + binding.name.removeprefix("LLAMA_ARG_")
    if binding.negatable and negated in environ:
        return False
    if binding.name not in environ:
        return MISSING
    text = environ[binding.name]
    try:
        return parse_bool(text) if binding.parse is None else binding.parse(text)
    except argparse.ArgumentTypeError as exc:
        message = "invalid value" if binding.name in SECRET_ENV else str(exc)
        raise ConfigError(binding.name, message) from None
    except ConfigError as exc:
        raise ConfigError(binding.name, str(exc)) from None


def supported_names(bindings: list[EnvBinding]) -> set[str]:
    names = {b.name for b in bindings}
    names |= {"LLAMA_ARG_NO_" + b.name.removeprefix("LLAMA_ARG_") for b in bindings if b.negatable}
    return names
