"""The MTP-head check reads the GGUF header only (no llama_cpp): a model without
nextn_predict_layers, or of an architecture the drafter does not support, is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvmem.errors import ConfigError
from kvmem.gguf.nextn_meta import check_mtp_head, nextn_layers
from tests.unit.gguf_headers import header_gguf


def _gguf(path: Path, arch: str, nextn: int | None) -> str:
    ints = (
        {"block_count": 2} if nextn is None else {"block_count": 2, "nextn_predict_layers": nextn}
    )
    return header_gguf(path, arch, ints)


def test_a_qwen35_with_a_nextn_layer_passes(tmp_path: Path) -> None:
    path = _gguf(tmp_path / "m.gguf", "qwen35", 1)
    assert nextn_layers(path) == ("qwen35", 1)
    check_mtp_head(path)


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
        check_mtp_head(path)
    assert message in str(err.value)


def test_not_a_gguf(tmp_path: Path) -> None:
    path = tmp_path / "x.gguf"
    path.write_bytes(b"nope")
    with pytest.raises(ConfigError, match="is not a readable GGUF file"):
        check_mtp_head(path)
