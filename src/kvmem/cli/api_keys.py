"""API keys from `--api-key` (CSV), `--api-key-file` and their environment variables.

Keys are printable ASCII without whitespace. `--api-key K1,K2` uses CSV quoting
(`"a,b",c` is two keys); a key file holds one key per line, `#` comments and blank lines
ignored, CRLF accepted. Every source adds keys. Empty lists, empty or unreadable files and
malformed quoting fail. Error messages never contain a key.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from kvmem.errors import ConfigError


@dataclass(frozen=True, slots=True)
class ApiKeys:
    """The accepted keys; `repr` and `str` show only how many there are."""

    keys: tuple[str, ...] = ()

    @property
    def enabled(self) -> bool:
        return bool(self.keys)

    def __repr__(self) -> str:
        return f"ApiKeys(<{len(self.keys)} keys>)"

    __str__ = __repr__


def _check_key(key: str, source: str) -> str:
    if not key:
        raise ConfigError(source, "empty API key")
    bad = next((i for i, ch in enumerate(key) if not ("!" <= ch <= "~")), None)
    if bad is not None:
        raise ConfigError(
            source,
            f"malformed API key (character {bad + 1} is whitespace, non-ASCII or not printable)",
        )
    return key


def parse_key_csv(text: str, source: str) -> list[str]:
    """One CSV row of keys; quoted fields may hold commas, `""` is a quote."""
    keys: list[str] = []
    i, n = 0, len(text)
    while True:
        if i < n and text[i] == '"':
            field, i = _quoted(text, i + 1, source)
            if i < n and text[i] != ",":
                raise ConfigError(
                    source, "malformed quoting in API key list (text after a closing quote)"
                )
        else:
            end = text.find(",", i)
            end = n if end == -1 else end
            field = text[i:end]
            if '"' in field:
                raise ConfigError(
                    source, "malformed quoting in API key list (quote inside an unquoted key)"
                )
            i = end
        keys.append(_check_key(field, source))
        if i >= n:
            return keys
        i += 1  # the comma


def _quoted(text: str, i: int, source: str) -> tuple[str, int]:
    out: list[str] = []
    n = len(text)
    while i < n:
        ch = text[i]
        if ch == '"':
            if i + 1 < n and text[i + 1] == '"':
                out.append('"')
                i += 2
                continue
            return "".join(out), i + 1
        out.append(ch)
        i += 1
    raise ConfigError(source, "malformed quoting in API key list (unterminated quote)")


def read_key_file(path: str, source: str) -> list[str]:
    """Keys from a file: one per line, `#` comments and blank lines ignored."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(
            source, f"cannot read API key file {path}: {exc.strerror or exc}"
        ) from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ConfigError(source, f"API key file {path} is not UTF-8 text") from None
    keys = []
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        keys.append(_check_key(stripped, f"{source} ({path}, line {number})"))
    if not keys:
        raise ConfigError(source, f"API key file {path} holds no keys")
    return keys


def collect_api_keys(
    csv_values: Iterable[tuple[str, str]], files: Iterable[tuple[str, str]]
) -> ApiKeys:
    """Keys from (value, source) CSV lists and (path, source) files, deduplicated in order."""
    keys: list[str] = []
    for value, source in csv_values:
        keys += parse_key_csv(value, source)
    for path, source in files:
        keys += read_key_file(path, source)
    return ApiKeys(tuple(dict.fromkeys(keys)))
