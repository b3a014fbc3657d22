"""--kvmem-disk-dir / -host-mib / -disk-mib / --kvmem-conversations: parsing, validation."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvmem.cli.server_config import load_server_settings
from kvmem.errors import ConfigError


def kvmem(*argv: str):
    return load_server_settings(list(argv), {})[0].engine.kvmem


def test_defaults_are_ram_only() -> None:
    kv = kvmem()
    assert (kv.disk_dir, kv.host_mib, kv.disk_mib, kv.conversations) == (None, 0, 0, 1)
    assert kvmem("--kvmem-conversations", "3").conversations == 3


def test_values_are_parsed(tmp_path: Path) -> None:
    kv = kvmem("--kvmem-disk-dir", str(tmp_path / "new"), "--kvmem-host-mib", "64")
    assert (kv.disk_dir, kv.host_mib, kv.disk_mib) == (str(tmp_path / "new"), 64, 0)
    kv = kvmem("--kvmem-disk-dir", str(tmp_path), "--kvmem-disk-mib", "1024")
    assert (kv.host_mib, kv.disk_mib) == (0, 1024)


@pytest.mark.parametrize(
    ("argv", "flag", "message"),
    [
        (["--kvmem-host-mib", "8"], "--kvmem-host-mib", "needs --kvmem-disk-dir"),
        (["--kvmem-disk-mib", "8"], "--kvmem-disk-mib", "needs --kvmem-disk-dir"),
        (["--kvmem-disk-dir", "{d}", "--kvmem-host-mib", "-1"], "--kvmem-host-mib", "must be >= 0"),
        (["--kvmem-disk-dir", "{d}", "--no-kvmem"], "--kvmem-disk-dir", "needs KVMem"),
        (["--kvmem-disk-dir", "{f}"], "--kvmem-disk-dir", "exists and is not a directory"),
        (["--kvmem-conversations", "0"], "--kvmem-conversations", "must be a positive number"),
        (
            ["--kvmem-conversations-mib", "8"],
            "--kvmem-conversations-mib",
            "needs --kvmem-conversations N >= 2",
        ),
        (
            ["--kvmem-conversations", "2", "--kvmem-conversations-mib", "-1"],
            "--kvmem-conversations-mib",
            "must be >= 0",
        ),
        (["--kvmem-conversations", "2", "--no-kvmem"], "--kvmem-conversations", "needs KVMem"),
    ],
)
def test_invalid_combinations_fail_before_the_model_loads(
    tmp_path: Path, argv: list[str], flag: str, message: str
) -> None:
    (tmp_path / "file").write_text("x")
    args = [a.format(d=tmp_path, f=tmp_path / "file") for a in argv]
    with pytest.raises(ConfigError) as info:
        kvmem(*args)
    assert info.value.flag == flag and message in str(info.value)


def test_conversations_with_a_disk_dir_and_a_cap(tmp_path: Path) -> None:
    kv = kvmem(
        "--kvmem-conversations", "2", "--kvmem-disk-dir", str(tmp_path),
        "--kvmem-conversations-mib", "40",
    )  # fmt: skip
    assert (kv.conversations, kv.disk_dir, kv.conversations_mib) == (2, str(tmp_path), 40)


def test_non_integer_mib_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--kvmem-host-mib: invalid integer value: '1.5'"):
        kvmem("--kvmem-disk-dir", str(tmp_path), "--kvmem-host-mib", "1.5")
