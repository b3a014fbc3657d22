"""The MTP-head check reads the GGUF header only (no llama_cpp): a model without
nextn_predict_layers, or of an architecture the drafter does not support, is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf import GGUFWriter

from kvmem.errors import ConfigError
from kvmem.gguf.nextn_meta import check_mtp_head, nextn_layers


def _gguf(path: Path, arch: str, nextn: int | None) -> Path:
    writer = GGUFWriter(str(path), arch)
    writer.add_block_count(2)
    writer.add_array("tokenizer.ggml.tokens", ["a", "b", "c"])  # skipped by the scan
    if nextn is not None:
        writer.add_uint32(f"{arch}.nextn_predict_layers", nextn)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_qwen35_with_a_nextn_layer_passes(tmp_path: Path) -> None:
    path = _gguf(tmp_path / "m.gguf", "qwen35", 1)
    assert nextn_layers(str(path)) == ("qwen35", 1)
    check_mtp_head(str(path))


@pytest.mark.parametrize(
    ("arch", "nextn", "message"),
    [
        ("qwen35", None, "draft-mtp needs a model with an MTP (nextn) head"),
        ("qwen35", 0, "has none"),
        ("deepseek2", 1, "draft-mtp supports qwen35 models; "),
    ],
)
def test_refused(tmp_path: Path, arch: str, nextn: int | None, message: str) -> None:
    path = _gguf(tmp_path / "m.gguf", arch, nextn)
    with pytest.raises(ConfigError, match="--spec-type") as err:
        check_mtp_head(str(path))
    assert message in str(err.value)


def test_not_a_gguf(tmp_path: Path) -> None:
    path = tmp_path / "x.gguf"
    path.write_bytes(b"nope")
    with pytest.raises(ConfigError, match="is not a readable GGUF file"):
        check_mtp_head(str(path))
