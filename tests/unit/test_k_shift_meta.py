"""Block moves need llama.cpp to shift the K cache, which it cannot do for a quantized K
cache without its Hadamard rotation (gguf/k_shift_meta.py): the settings refuse such a
model before any weights load, read from the GGUF header alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvmem.cli.server_config import load_server_settings
from kvmem.errors import ConfigError
from kvmem.gguf.k_shift_meta import check_quantized_k_shift, rotation_disabled
from kvmem.gguf.kv_size import read_kv_geometry
from kvmem.memory.layout import PositionMode
from tests.unit.gguf_headers import header_gguf

QUANTIZED = ("--kv-dtype", "q8_0", "-fa", "on")


def _gguf(path: Path, *, key_length: int | None, n_embd: int = 256, n_head: int = 4) -> str:
    ints = {"block_count": 2, "embedding_length": n_embd, "attention.head_count": n_head}
    if key_length is not None:
        ints["attention.key_length"] = key_length
    return header_gguf(path, "llama", ints)


@pytest.mark.parametrize(
    ("key_length", "n_embd", "n_head", "head"),
    [(None, 256, 4, 64), (None, 128, 4, 32), (96, 256, 4, 96), (128, 256, 4, 128)],
)
def test_the_head_size_is_the_key_length_else_the_embedding_per_head(
    tmp_path: Path, key_length: int | None, n_embd: int, n_head: int, head: int
) -> None:
    path = _gguf(tmp_path / "m.gguf", key_length=key_length, n_embd=n_embd, n_head=n_head)
    assert read_kv_geometry(path).head_dim_k == head  # what the check reads


@pytest.mark.parametrize(
    ("key_length", "refused"), [(64, False), (128, False), (32, True), (96, True)]
)
def test_only_head_sizes_of_64s_shift(tmp_path: Path, key_length: int, refused: bool) -> None:
    path = _gguf(tmp_path / "m.gguf", key_length=key_length)
    if not refused:
        check_quantized_k_shift(path, PositionMode.COMPACT)
        return
    with pytest.raises(ConfigError, match="--kvmem-positions") as err:
        check_quantized_k_shift(path, PositionMode.COMPACT)
    assert f"K head size is {key_length}, not a multiple of 64" in str(err.value)


@pytest.mark.parametrize(
    ("value", "disabled"), [("", False), ("0", False), ("1", True), ("2", True), ("yes", False)]
)
def test_the_rotation_switch_reads_as_atoi(
    monkeypatch: pytest.MonkeyPatch, value: str, disabled: bool
) -> None:
    monkeypatch.setenv("LLAMA_ATTN_ROT_DISABLE", value)
    assert rotation_disabled() is disabled


def test_a_disabled_rotation_refuses_every_head_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _gguf(tmp_path / "m.gguf", key_length=128)
    monkeypatch.setenv("LLAMA_ATTN_ROT_DISABLE", "1")
    with pytest.raises(ConfigError, match="LLAMA_ATTN_ROT_DISABLE is set"):
        check_quantized_k_shift(path, PositionMode.GATHER)


@pytest.mark.parametrize(
    ("argv", "refused"),
    [
        ((*QUANTIZED,), True),  # the default layout moves blocks
        ((*QUANTIZED, "--kvmem-positions", "gather"), True),
        ((*QUANTIZED, "--kvmem-positions", "original"), False),
        ((*QUANTIZED, "--no-kvmem"), False),
        (("--kv-dtype", "f16"), False),
        (("-ctk", "f32", "-ctv", "f16"), False),
    ],
)
def test_the_server_settings_refuse_before_loading(
    tmp_path: Path, argv: tuple[str, ...], refused: bool
) -> None:
    path = _gguf(tmp_path / "m.gguf", key_length=32)
    args = ["-m", path, *argv]
    if not refused:
        assert load_server_settings(args, {})[0].engine.model_path == path
        return
    with pytest.raises(ConfigError, match="--kvmem-positions") as err:
        load_server_settings(args, {})
    assert "use --kvmem-positions original or a float K cache" in str(err.value)
