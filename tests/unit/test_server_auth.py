"""API keys: CSV and file parsing, validation, constant-time header checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvmem.cli.api_keys import ApiKeys, collect_api_keys, parse_key_csv, read_key_file
from kvmem.errors import AuthenticationError, ConfigError
from kvmem.server.auth import ApiKeyChecker, bearer_token


@pytest.mark.parametrize(
    ("text", "keys"),
    [
        ("k1", ["k1"]),
        ("k1,k2", ["k1", "k2"]),
        ('"a,b",c', ["a,b", "c"]),
        ('"say""hi""",x', ['say"hi"', "x"]),
        ('"quoted"', ["quoted"]),
    ],
)
def test_csv_keys(text: str, keys: list[str]) -> None:
    assert parse_key_csv(text, "--api-key") == keys


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty API key"),
        ("a,", "empty API key"),
        ('"abc', "unterminated quote"),
        ('"a"b', "text after a closing quote"),
        ('a"b', "quote inside an unquoted key"),
        ("tab\tkey", "malformed API key"),
        ("ключ", "malformed API key"),
    ],
)
def test_malformed_csv_keys(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        parse_key_csv(text, "--api-key")
    assert info.value.flag == "--api-key"


def test_key_file_comments_blank_lines_crlf(tmp_path: Path) -> None:
    path = tmp_path / "keys.txt"
    path.write_bytes(b"\xef\xbb\xbf# comment\r\n\r\nsk-one\r\n  sk-two  \n#sk-disabled\n")
    assert read_key_file(str(path), "--api-key-file") == ["sk-one", "sk-two"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "holds no keys"),
        (b"# only a comment\n\n", "holds no keys"),
        (b"bad key\n", "line 1"),
        (b"\xff\xfe", "not UTF-8"),
    ],
)
def test_bad_key_files(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "keys.txt"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=message):
        read_key_file(str(path), "--api-key-file")


def test_unreadable_key_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read API key file"):
        read_key_file(str(tmp_path / "missing.txt"), "--api-key-file")
    with pytest.raises(ConfigError, match="cannot read API key file"):
        read_key_file(str(tmp_path), "--api-key-file")


def test_collect_deduplicates_in_order_and_hides_values() -> None:
    keys = collect_api_keys([("a,b", "env"), ("b,c", "--api-key")], [])
    assert keys.keys == ("a", "b", "c")
    assert repr(keys) == "ApiKeys(<3 keys>)" == str(keys)
    assert not ApiKeys().enabled


def test_checker_accepts_bearer_or_x_api_key() -> None:
    checker = ApiKeyChecker(ApiKeys(("sk-1", "sk-2")))
    checker.check("Bearer sk-2", None)
    checker.check("bearer   sk-1 ", None)
    checker.check(None, "sk-1")
    checker.check("Bearer wrong", "sk-2")
    with pytest.raises(AuthenticationError, match="missing API key"):
        checker.check(None, None)
    with pytest.raises(AuthenticationError, match="invalid API key"):
        checker.check("Bearer sk-3", None)
    with pytest.raises(AuthenticationError, match="invalid API key"):
        checker.check("Basic sk-1", None)
    with pytest.raises(AuthenticationError):
        checker.check(None, "sk-1x")


def test_no_keys_means_no_authentication() -> None:
    checker = ApiKeyChecker(ApiKeys())
    assert not checker.enabled
    checker.check(None, None)


def test_bearer_parsing() -> None:
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("Token abc") is None
    assert bearer_token("Bearer ") is None
    assert bearer_token(None) is None
