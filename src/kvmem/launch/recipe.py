"""Recipes (JSON files in kvmem/launch/recipes) and the launch plan built from one.

A plan is the exact kvmem-server argv, plus the notes and sizing that explain it. The
environment overrides the recipe: MODEL, MMPROJ, HOST, PORT, API_KEY_FILE (command-line
options of kvmem-launch override the environment).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from kvmem.errors import ConfigError, ModelNotFoundError
from kvmem.gguf.kv_size import (
    MIB,
    Sizing,
    parse_size,
    read_kv_geometry,
    size_budget,
    weights_bytes,
)
from kvmem.launch.workers import RpcRecipe, WorkerPlan, plan_workers, rpc_flag
from kvmem.memory.ggml_types import parse_kv_type

OVERRIDES = ("MODEL", "MMPROJ", "HOST", "PORT", "API_KEY_FILE")
SERVER_MODULE = "kvmem.server.main"
MODEL_PLACEHOLDER = "$MODEL"  # a dry run's -m when no model is given


@dataclass(frozen=True, slots=True)
class Recipe:
    name: str
    description: str
    host: str
    port: int
    args: tuple[str, ...]
    mmproj_args: tuple[str, ...]
    budget: int
    gen_reserve: int
    overhead_mib: int
    reserve_fraction: float
    model: str | None = None
    model_hint: str = ""
    embedded_model: bool = False
    mtp_args: tuple[str, ...] = ()
    mtp_note: str = ""
    rpc: RpcRecipe | None = None  # local RPC workers started before the server


def recipe_names() -> list[str]:
    folder = resources.files("kvmem.launch") / "recipes"
    return sorted(
        p.name.removesuffix(".json") for p in folder.iterdir() if p.name.endswith(".json")
    )


def load_recipe(name: str) -> Recipe:
    path = Path(name)
    if path.suffix == ".json" and path.is_file():
        text = path.read_text(encoding="utf-8")
    elif name in recipe_names():
        text = (resources.files("kvmem.launch") / "recipes" / f"{name}.json").read_text("utf-8")
    else:
        raise ConfigError(
            "recipe", f"unknown recipe {name!r}; recipes: {', '.join(recipe_names())}"
        )
    try:
        data: dict[str, Any] = json.loads(text)
        mtp = data.get("mtp") or {}
        return Recipe(
            name=data["name"],
            description=data["description"],
            host=data["host"],
            port=int(data["port"]),
            args=tuple(data["args"]),
            mmproj_args=tuple(data.get("mmproj_args", ())),
            budget=int(data["kvmem"]["budget"]),
            gen_reserve=int(data["kvmem"]["gen_reserve"]),
            overhead_mib=int(data["sizing"]["overhead_mib"]),
            reserve_fraction=float(data["sizing"]["reserve_fraction"]),
            model=data.get("model"),
            model_hint=data.get("model_hint", ""),
            embedded_model=bool(data.get("embedded_model", False)),
            mtp_args=tuple(mtp.get("args", ())),
            mtp_note=mtp.get("note", ""),
            rpc=RpcRecipe.from_json(data.get("rpc")),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError("recipe", f"recipe {name!r} is malformed: {exc!r}") from None


@dataclass(slots=True)
class LaunchOptions:
    model: str | None = None
    mmproj: str | None = None
    host: str | None = None
    port: int | None = None
    api_key_file: str | None = None
    gpu_mem: str | None = None
    extra: tuple[str, ...] = ()
    dry_run: bool = False  # plan without the files: what could not be checked is listed


@dataclass(slots=True)
class Plan:
    recipe: str
    argv: list[str]
    host: str
    port: int
    model: str | None  # None: the embedded model
    mmproj: str | None
    api_key_file: str | None
    sizing: Sizing | None
    notes: list[str] = field(default_factory=list)
    overrides: dict[str, str] = field(default_factory=dict)
    unchecked: list[str] = field(default_factory=list)  # a dry run's missing files and checks
    workers: list[WorkerPlan] = field(default_factory=list)  # the recipe's RPC workers

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return f"http://{host}:{self.port}/"

    def files(self) -> list[tuple[str, str]]:
        """(what, path) of every file the server will need."""
        out = [("model", self.model)] if self.model else []
        if self.mmproj:
            out.append(("projector", self.mmproj))
        if self.api_key_file:
            out.append(("API key file", self.api_key_file))
        extra = self.argv[self.argv.index(SERVER_MODULE) + 1 :]
        for flag in ("--ui-dir", "--path", "--chat-template-file"):
            if flag in extra[:-1]:
                out.append((flag, extra[extra.index(flag) + 1]))
        return out


def _pick(cli: Any, env: Mapping[str, str], name: str, default: Any, used: dict[str, str]) -> Any:
    if cli is not None:
        return cli
    if env.get(name):
        used[name] = env[name]
        return env[name]
    return default


def _kv_types(args: Sequence[str]) -> tuple[Any, Any]:
    k = v = parse_kv_type("f16", "--kv-dtype")
    for i, arg in enumerate(args[:-1]):
        value = args[i + 1]
        if arg == "--kv-dtype":
            k = v = parse_kv_type(value, arg)
        elif arg in ("-ctk", "--cache-type-k"):
            k = parse_kv_type(value, arg)
        elif arg in ("-ctv", "--cache-type-v"):
            v = parse_kv_type(value, arg)
    return k, v


def _ctx_size(args: Sequence[str]) -> int | None:
    """The last -c (the server's argparse keeps the last one)."""
    found = None
    for i, arg in enumerate(args[:-1]):
        if arg in ("-c", "--ctx-size"):
            try:
                found = int(args[i + 1])
            except ValueError:
                raise ConfigError(arg, f"not a number: {args[i + 1]!r}") from None
    return found


def _embedded_model_path() -> str:
    from kvmem.gguf.model_path import default_model_path

    return default_model_path()


def _embedded_model_file(dry_run: bool, unchecked: list[str]) -> str | None:
    """The embedded model's file; without its package a dry run lists it as unchecked."""
    try:
        return _embedded_model_path()
    except ModelNotFoundError as exc:
        if not dry_run:
            raise ConfigError("MODEL", str(exc)) from None
        unchecked.append(f"model: {exc}")
        return None


def server_supports(flag: str) -> bool:
    """Whether kvmem-server accepts `flag` with its meaning (not merely rejects it)."""
    from kvmem.cli.compat_flags import REJECTED_FLAGS
    from kvmem.cli.server_args import build_server_parser

    if any(flag in spec.flags for spec in REJECTED_FLAGS):
        return False
    return flag in build_server_parser()._option_string_actions


def spec_supported(args: Sequence[str]) -> bool:
    """Whether kvmem-server runs the `--spec-type` value in `args` (draft-mtp needs a model
    with an MTP head: the caller checks that)."""
    from kvmem.spec_config import SpecConfig, parse_spec_type

    try:
        SpecConfig(type=parse_spec_type(args[list(args).index("--spec-type") + 1])).validate()
    except (ValueError, IndexError, ConfigError):
        return False
    return True


def build_plan(recipe: Recipe, options: LaunchOptions, environ: Mapping[str, str]) -> Plan:
    used: dict[str, str] = {}
    model = _pick(options.model, environ, "MODEL", recipe.model, used)
    mmproj = _pick(options.mmproj, environ, "MMPROJ", None, used)
    host = _pick(options.host, environ, "HOST", recipe.host, used)
    port_text = _pick(options.port, environ, "PORT", recipe.port, used)
    key_file = _pick(options.api_key_file, environ, "API_KEY_FILE", None, used)
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigError("PORT", f"not a port number: {port_text!r}") from None
    if not 0 < port < 65536:
        raise ConfigError("PORT", f"{port} is out of range")
    unchecked: list[str] = []
    if model is None and not recipe.embedded_model:
        if not options.dry_run:
            raise ConfigError("MODEL", f"recipe {recipe.name} needs a model: {recipe.model_hint}")
        unchecked.append(
            f"model: MODEL is not set, so -m is the placeholder {MODEL_PLACEHOLDER}"
            f" (the recipe wants {recipe.model_hint})"
        )
    model = None if model is None else os.path.abspath(model)
    mmproj = None if mmproj is None else os.path.abspath(mmproj)
    key_file = None if key_file is None else os.path.abspath(key_file)
    notes: list[str] = []
    k_type, v_type = _kv_types([*recipe.args, *options.extra])
    model_file = model or (
        _embedded_model_file(options.dry_run, unchecked)
        if options.gpu_mem and recipe.embedded_model
        else None
    )
    geometry = None
    if model_file and os.path.isfile(model_file):
        geometry = read_kv_geometry(model_file)
    elif model_file and options.dry_run:
        unchecked.append(f"model: {model_file} not found, so its KV geometry was not read")
    sizing = None
    budget, reserve = recipe.budget, recipe.gen_reserve
    if options.gpu_mem and (geometry is None or model_file is None) and options.dry_run:
        parse_size(options.gpu_mem)  # the value is still checked
        unchecked.append(
            f"--gpu-mem {options.gpu_mem}: not sized without the model file; the plan uses the"
            f" recipe's budget {budget} + gen reserve {reserve}"
        )
    elif options.gpu_mem:
        if geometry is None or model_file is None:
            raise ConfigError("--gpu-mem", f"sizing needs the model file: {model_file} not found")
        offloaded = mmproj if "--no-mmproj-offload" not in recipe.mmproj_args else None
        weights = weights_bytes(model_file, offloaded)
        ctx = _ctx_size([*recipe.args, *options.extra]) or geometry.n_ctx_train or 1 << 30
        sizing = size_budget(
            parse_size(options.gpu_mem),
            weights,
            recipe.overhead_mib * MIB,
            geometry,
            k_type,
            v_type,
            block_tokens=128,
            reserve_fraction=recipe.reserve_fraction,
            max_cells=ctx,
        )
        budget, reserve = sizing.budget, sizing.gen_reserve
    else:
        notes.append(
            f"KVMem window: the recipe's budget {budget} + gen reserve {reserve}"
            " (pass --gpu-mem SIZE to size it from the GPU memory)"
        )
    mtp: list[str] = []
    if recipe.mtp_args:
        supported = server_supports(recipe.mtp_args[0]) and spec_supported(recipe.mtp_args)
        has_head = geometry is not None and geometry.has_mtp_head
        from kvmem.spec_config import MTP_ARCHS

        drafter_arch = geometry is not None and geometry.arch in MTP_ARCHS
        if supported and has_head and drafter_arch:
            mtp = list(recipe.mtp_args)
            notes.append(f"MTP: on ({' '.join(mtp)})")
        else:
            why = []
            if geometry is None:
                why.append("the model file could not be read to look for an MTP head")
            elif not has_head:
                why.append("the model has no MTP head")
            elif not drafter_arch:
                why.append(f"draft-mtp supports {', '.join(MTP_ARCHS)} models, not {geometry.arch}")
            if not supported:
                why.append(f"kvmem-server does not support {' '.join(recipe.mtp_args[:2])} yet")
            notes.append(f"MTP: off, dropping {' '.join(recipe.mtp_args)}: {'; '.join(why)}")
    argv = [sys.executable, "-m", SERVER_MODULE]
    if model or not recipe.embedded_model:
        argv += ["-m", model or MODEL_PLACEHOLDER]
    if mmproj:
        argv += ["--mmproj", mmproj, *recipe.mmproj_args]
    argv += [*recipe.args, "--kvmem-budget", str(budget), "--kvmem-gen-reserve", str(reserve)]
    argv += mtp
    if key_file:
        argv += ["--api-key-file", key_file]
    workers = plan_workers(recipe.rpc, port) if recipe.rpc is not None else []
    if workers:
        notes.append(
            f"RPC: {len(workers)} local kvmem-rpc-worker processes share the layers "
            "(loopback only: the RPC protocol has no authentication)"
        )
    argv += [*rpc_flag(workers), "--host", host, "--port", str(port), *options.extra]
    plan = Plan(recipe.name, argv, host, port, model, mmproj, key_file, sizing, notes, used)
    plan.workers = workers
    if options.dry_run:
        unchecked += [
            f"{what}: {path} not found"
            for what, path in plan.files()
            if what != "model" and not os.path.exists(path)
        ]
        if recipe.mtp_args and geometry is None:
            unchecked.append("MTP head: the model file was not read, so MTP is left off")
    plan.unchecked = unchecked
    return plan
