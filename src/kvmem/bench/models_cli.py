"""`kvmem-bench models [NAME] [--check]`: the named models, and the path of one's GGUF.

With a name it prints the path of the joined, verified GGUF (joining the installed parts
on first use), so that `-m "$(kvmem-bench models qwen-0.5b)"` works with any tool.
`--check` hashes the cached file again instead of trusting its sidecar.
"""

from __future__ import annotations

import argparse
import time

from kvmem.bench.report import format_table
from kvmem.errors import ConfigError
from kvmem.models import MODELS, default_cache_dir, ensure_model, is_verified, lookup


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "models", help="list the named models, or print the path of one (joined on first use)"
    )
    p.add_argument("name", nargs="?", default=None, help="a model name, e.g. qwen-0.5b")
    p.add_argument("--check", action="store_true", help="hash the cached file again (MD5 and size)")
    p.set_defaults(handler=run)


def run(ns: argparse.Namespace) -> int:
    if ns.name is None:
        if ns.check:
            raise ConfigError("--check", "name the model to check, e.g. qwen-0.5b")
        print(listing())
        return 0
    model = lookup(ns.name)
    if model is None:
        raise ConfigError("name", f"unknown model {ns.name!r}; known: {', '.join(MODELS)}")
    t0 = time.perf_counter()
    path = ensure_model(model, recheck=ns.check)
    print(path)
    if ns.check:
        print(
            f"ok: {model.size:,} bytes, MD5 {model.md5} (checked in "
            f"{time.perf_counter() - t0:.1f} s)"
        )
    return 0


def listing() -> str:
    rows = []
    for model in MODELS.values():
        target = default_cache_dir() / model.file_name
        state = "joined" if target.is_file() and is_verified(model, target) else "not joined"
        rows.append([model.name, model.description, f"{model.size:,}", state])
    table = format_table(["name", "model", "bytes", "cache"], rows, "named models")
    extras = ", ".join(f"pip install 'kvmem[{m.extra}]'" for m in MODELS.values() if m.extra)
    return f"{table}\n\ncache: {default_cache_dir()}\ninstall the parts with: {extras}"
