"""`kvmem-launch RECIPE`: start (or reuse) kvmem-server with a recipe's tuned configuration.

    kvmem-launch --list
    kvmem-launch cpu-smollm2 [--dry-run | --restart | --stop] [--gpu-mem 16GiB] [-- SERVER FLAGS]

Exit status: 0 done (started, reused, stopped, printed); 1 refused (a port held by
something else, a mismatching server: use --restart); 2 invalid configuration.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence

from kvmem.errors import ConfigError
from kvmem.launch.recipe import LaunchOptions, Plan, build_plan, load_recipe, recipe_names
from kvmem.launch.service import (
    LaunchRefused,
    ServiceFiles,
    listener_on,
    matching_listener,
    port_lock,
    read_ours,
    start,
    stop,
)
from kvmem.launch.workers import ensure_workers, stop_workers

_SECRET_ENV = ("LLAMA_API_KEY", "LLAMA_ARG_API_KEY")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvmem-launch",
        description="Start kvmem-server from a launch recipe; reuse a matching running server.",
        epilog="Environment overrides of the recipe: MODEL, MMPROJ, HOST, PORT, API_KEY_FILE. "
        "Arguments after -- go to kvmem-server. State: $KVMEM_LAUNCH_DIR "
        "(default ~/.cache/kvmem/launch).",
    )
    p.add_argument("recipe", nargs="?", help="recipe name (see --list) or a recipe .json file")
    p.add_argument("--list", action="store_true", help="list the packaged recipes and exit")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--dry-run",
        action="store_true",
        help="print argv and environment as JSON, starting nothing; works without the model "
        "files (the JSON's 'unchecked' lists what could not be checked)",
    )
    mode.add_argument(
        "--restart", action="store_true", help="stop the server this launcher started, then start"
    )
    mode.add_argument("--stop", action="store_true", help="stop the server this launcher started")
    p.add_argument(
        "--gpu-mem",
        metavar="SIZE",
        help="size --kvmem-budget/--kvmem-gen-reserve for this much GPU memory (e.g. 16GiB)",
    )
    p.add_argument("--model", help="model GGUF (overrides MODEL)")
    p.add_argument("--mmproj", help="projector GGUF (overrides MMPROJ)")
    p.add_argument("--host", help="address (overrides HOST)")
    p.add_argument("--port", type=int, help="port (overrides PORT)")
    p.add_argument("--api-key-file", help="API key file (overrides API_KEY_FILE)")
    p.add_argument(
        "--wait",
        type=float,
        default=600.0,
        metavar="S",
        help="seconds to wait for /health (default 600)",
    )
    return p


def _server_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables kvmem-server reads that it inherits from this environment."""
    out = {}
    for name, value in sorted(environ.items()):
        if name.startswith(("LLAMA_ARG_", "LLAMA_API_", "KVMEM_")) and name != "KVMEM_LAUNCH_DIR":
            out[name] = "<set>" if name in _SECRET_ENV else value
    return out


def _say(text: str) -> None:
    print(f"kvmem-launch: {text}", file=sys.stderr)


def _explain(plan: Plan) -> None:
    if plan.sizing is not None:
        _say(
            f"sized the KVMem window: budget {plan.sizing.budget} + gen reserve {plan.sizing.gen_reserve}"
        )
        for line in plan.sizing.reason:
            _say(f"  {line}")
    for note in plan.notes:
        _say(note)
    for name, value in plan.overrides.items():
        _say(f"{name}={value} (from the environment)")
    for line in plan.unchecked:
        _say(f"not checked: {line}")


def _preflight(plan: Plan) -> None:
    for what, path in plan.files():
        if not os.path.isfile(path) and not (
            what in ("--ui-dir", "--path") and os.path.isdir(path)
        ):
            raise ConfigError(what, f"not found: {path}")
        if not os.access(path, os.R_OK):
            raise ConfigError(what, f"not readable: {path}")


def _run(ns: argparse.Namespace, extra: list[str], environ: Mapping[str, str]) -> int:
    recipe = load_recipe(ns.recipe)
    options = LaunchOptions(
        ns.model, ns.mmproj, ns.host, ns.port, ns.api_key_file, ns.gpu_mem, tuple(extra), ns.dry_run
    )
    plan = build_plan(recipe, options, environ)
    files = ServiceFiles(plan.port)
    _explain(plan)
    if ns.dry_run:
        body = {
            "recipe": plan.recipe,
            "argv": plan.argv,
            "env": _server_env(environ),
            "overrides": plan.overrides,
            "url": plan.url,
            "sizing": None
            if plan.sizing is None
            else {
                "budget": plan.sizing.budget,
                "gen_reserve": plan.sizing.gen_reserve,
                "kv_bytes_per_token": plan.sizing.bytes_per_token,
                "kv_bytes": plan.sizing.kv_bytes,
                "reason": plan.sizing.reason,
            },
            "notes": plan.notes,
            "unchecked": plan.unchecked,  # what a dry run could not check (missing files)
            "pidfile": str(files.pidfile),
            "log": str(files.log),
        }
        if plan.workers:  # started first, in this order (launch/workers.py)
            body["workers"] = [w.as_json() for w in plan.workers]
        print(json.dumps(body, indent=2))
        return 0
    with port_lock(files):
        ours = read_ours(files)
        listener = listener_on(plan.port)
        if ns.stop:
            if ours is None:
                if listener is not None:
                    raise LaunchRefused(
                        f"port {plan.port} is held by a listener this launcher did not start ({listener.describe()}); not touching it"
                    )
                _say(f"no server started by kvmem-launch runs on port {plan.port}")
            else:
                _say(f"pid {ours.pid} {stop(ours, files)}")
            for line in stop_workers(plan.workers):
                _say(line)
            return 0
        if listener is not None and (ours is None or listener.pid != ours.pid):
            why = matching_listener(listener, plan.argv, plan.host)
            if why is None and not ns.restart:
                _say(f"reusing the running server at {plan.url} (pid {listener.pid})")
                return 0
            if ns.restart:
                raise LaunchRefused(
                    f"port {plan.port} is held by a listener this launcher did not start ({listener.describe()}); --restart stops only its own server"
                )
            raise LaunchRefused(
                f"port {plan.port} is in use and not reusable: {why}; use --restart to replace a server this launcher started"
            )
        if ours is not None and not ns.restart:
            why = (
                matching_listener(listener, plan.argv, plan.host)
                if listener
                else "it is not listening (still loading the model, or stuck)"
            )
            if why is None:
                _say(f"reusing the running server at {plan.url} (pid {ours.pid})")
                return 0
            raise LaunchRefused(
                f"the server this launcher started on port {plan.port} (pid {ours.pid}) does not match: {why}; use --restart"
            )
        _preflight(plan)
        if ours is not None:
            _say(f"pid {ours.pid} {stop(ours, files)}")
        for line in ensure_workers(plan.workers, ns.restart, ns.wait):
            _say(line)
        started = start(plan.argv, files, plan.host, ns.wait)
        _say(f"serving at {plan.url} (pid {started.pid}, log {files.log})")
        return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in args:
        cut = args.index("--")
        args, extra = args[:cut], args[cut + 1 :]
    parser = build_parser()
    ns = parser.parse_args(args)
    if ns.list:
        for name in recipe_names():
            print(f"{name}: {load_recipe(name).description}")
        return 0
    if not ns.recipe:
        parser.error("give a recipe (see --list)")
    try:
        return _run(ns, extra, os.environ)
    except ConfigError as exc:
        _say(f"error: {exc}")
        return 2
    except LaunchRefused as exc:
        _say(f"refused: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
