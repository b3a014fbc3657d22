"""Dependencies point one way: memory <- engine <- server/cli, memory <- chat <- server/cli.

kvmem.memory imports only numpy, gguf, the standard library, kvmem.errors and itself;
kvmem.engine is the only package that imports llama_cpp, and kvmem.chat imports no
kvmem.engine module (the server hands it an engine through `chat.protocol`). tests/unit
collects with llama_cpp absent. kvmem.models (named models
from PyPI parts) is standard library only and is imported only by cli, server and bench.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "kvmem"
MEMORY_ALLOWED_THIRD_PARTY = ("numpy", "gguf")
MEMORY_ALLOWED_KVMEM = ("kvmem.errors", "kvmem.memory")
FORBIDDEN_FOR_MEMORY = ("llama_cpp", "kvmem.engine", "kvmem.server", "kvmem.chat", "kvmem.cli")
MODELS_ALLOWED_KVMEM = ("kvmem.errors", "kvmem.models")
MODELS_IMPORTERS = ("kvmem.models", "kvmem.cli", "kvmem.server", "kvmem.bench")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> list[str]:
    return _imports_in_source(
        path.read_text(encoding="utf-8"), _module_name(path), path.name == "__init__.py"
    )


def _imports_in_source(source: str, module_name: str, is_package: bool) -> list[str]:
    """Every module a source imports, anywhere in it, with relative imports resolved."""
    tree = ast.parse(source)
    package = module_name if is_package else module_name.rpartition(".")[0]
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names.append(module)
            names.extend(
                f"{module}.{alias.name}" for alias in node.names if module.startswith("kvmem")
            )
    return names


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _memory_import_allowed(name: str) -> bool:
    top = name.split(".")[0]
    if top == "__future__" or top in sys.stdlib_module_names:
        return True
    if top in MEMORY_ALLOWED_THIRD_PARTY:
        return True
    return any(_within(name, allowed) for allowed in MEMORY_ALLOWED_KVMEM)


def _sources(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def test_memory_sources_import_only_allowed_modules() -> None:
    files = _sources(PACKAGE / "memory")
    assert files, "kvmem/memory has no sources"
    bad = []
    for path in files:
        for name in _imports(path):
            forbidden = any(_within(name, f) for f in FORBIDDEN_FOR_MEMORY)
            if forbidden or not _memory_import_allowed(name):
                bad.append(f"{path.relative_to(SRC)} imports {name}")
    assert bad == []


def test_only_engine_imports_llama_cpp() -> None:
    bad = []
    for path in _sources(PACKAGE):
        if _within(_module_name(path), "kvmem.engine"):
            continue
        bad.extend(
            f"{path.relative_to(SRC)} imports {name}"
            for name in _imports(path)
            if _within(name, "llama_cpp")
        )
    assert bad == []


def test_models_sources_import_only_the_standard_library() -> None:
    files = _sources(PACKAGE / "models")
    assert files, "kvmem/models has no sources"
    bad = []
    for path in files:
        for name in _imports(path):
            top = name.split(".")[0]
            stdlib = top == "__future__" or top in sys.stdlib_module_names
            if not stdlib and not any(_within(name, a) for a in MODELS_ALLOWED_KVMEM):
                bad.append(f"{path.relative_to(SRC)} imports {name}")
    assert bad == []


def test_only_cli_server_and_bench_import_models() -> None:
    bad = []
    for path in _sources(PACKAGE):
        module = _module_name(path)
        if any(_within(module, allowed) for allowed in MODELS_IMPORTERS):
            continue
        bad.extend(
            f"{path.relative_to(SRC)} imports {name}"
            for name in _imports(path)
            if _within(name, "kvmem.models")
        )
    assert bad == []


def test_checker_sees_relative_and_nested_imports() -> None:
    source = (
        "def f():\n"
        "    import llama_cpp.llama_cpp\n"
        "from ..engine import model\n"
        "from . import rope\n"
        "from .host_store import BlockKV\n"
    )
    names = _imports_in_source(source, "kvmem.memory.planner", is_package=False)
    assert sorted(names) == [
        "kvmem.engine",
        "kvmem.engine.model",
        "kvmem.memory",
        "kvmem.memory.host_store",
        "kvmem.memory.host_store.BlockKV",
        "kvmem.memory.rope",
        "llama_cpp.llama_cpp",
    ]
    assert not _memory_import_allowed("llama_cpp.llama_cpp")
    assert not _memory_import_allowed("kvmem.engine.model")
    assert not _memory_import_allowed("fastapi")
    assert _memory_import_allowed("kvmem.memory.rope")
    assert _memory_import_allowed("numpy.typing")
    assert _memory_import_allowed("collections.abc")


def test_importing_memory_does_not_load_llama_cpp_or_upper_layers() -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    code = (
        "import sys, kvmem.memory\n"
        "bad = sorted(m for m in sys.modules if m == 'llama_cpp' or m.startswith('llama_cpp.')"
        " or m.split('.')[:2] in (['kvmem', 'engine'], ['kvmem', 'server'], ['kvmem', 'chat'],"
        " ['kvmem', 'cli']))\n"
        "print(','.join(bad))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""


def test_chat_imports_no_engine_module() -> None:
    files = _sources(PACKAGE / "chat")
    assert files, "kvmem/chat has no sources"
    bad = []
    for path in files:
        bad.extend(
            f"{path.relative_to(SRC)} imports {name}"
            for name in _imports(path)
            if _within(name, "kvmem.engine") or _within(name, "llama_cpp")
        )
    assert bad == []


_BLOCK_LLAMA = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "llama_cpp" or name.startswith("llama_cpp."):
            raise ImportError("llama_cpp blocked")
sys.meta_path.insert(0, Block())
try:
    import llama_cpp
except ImportError:
    print("llama_cpp blocked")
else:
    raise SystemExit("the blocker let llama_cpp through")
"""


def _run_without_llama(code: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return subprocess.run(
        [sys.executable, "-c", _BLOCK_LLAMA + code],
        cwd=SRC.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_chat_engine_records_and_bench_parser_load_without_llama_cpp() -> None:
    modules = sorted(_module_name(p) for p in _sources(PACKAGE / "chat"))
    code = (
        "import importlib\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "bad = sorted(m for m in sys.modules if m.startswith('kvmem.engine'))\n"
        "print('chat loads:', ','.join(bad))\n"
        "from kvmem.engine_settings import EngineSettings, GpuPlacement, MAX_LANES\n"
        "from kvmem.gguf.model_path import resolve_model_path\n"
        "from kvmem.sampling import SamplingParams\n"
        "print('records ok')\n"
        "from kvmem.bench.main import build_parser\n"
        "build_parser()\n"
        "print('kvmem-bench parser ok')\n"
    )
    result = _run_without_llama(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "llama_cpp blocked",
        "chat loads: ",
        "records ok",
        "kvmem-bench parser ok",
    ]


def test_unit_tests_collect_without_llama_cpp() -> None:
    code = (
        "import pytest\n"
        "sys.exit(pytest.main(['--collect-only', '-q', '-p', 'no:cacheprovider', 'tests/unit']))\n"
    )
    result = _run_without_llama(code)
    lines = result.stdout.splitlines()
    errors = [line for line in lines if line.startswith("ERROR")]
    assert errors == [], result.stdout[-4000:]
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr
    assert lines[0] == "llama_cpp blocked"
    assert re.fullmatch(r"\d+ tests collected in [\d.]+s", lines[-1]), lines[-1]


def test_cli_does_not_import_the_server() -> None:
    """kvmem.server imports the flag layer (kvmem.cli); never the other way round."""
    bad = []
    for path in _sources(PACKAGE / "cli"):
        bad.extend(
            f"{path.relative_to(SRC)} imports {name}"
            for name in _imports(path)
            if _within(name, "kvmem.server")
        )
    assert bad == []


def test_settings_import_only_the_standard_library_and_errors() -> None:
    """kvmem.settings (flag records, value parsers, `setting()`) is the bottom layer."""
    bad = []
    for path in _sources(PACKAGE / "settings"):
        for name in _imports(path):
            top = name.split(".")[0]
            stdlib = top == "__future__" or top in sys.stdlib_module_names
            ours = _within(name, "kvmem.settings") or _within(name, "kvmem.errors")
            if not stdlib and not ours:
                bad.append(f"{path.relative_to(SRC)} imports {name}")
    assert bad == []


# The server's layers: state <- request flow <- one router per API <- app (issue 27).
SERVER = "kvmem.server"
SERVER_FLOW = ("state", "flow", "chat_flow", "completion_flow")
SERVER_SHARED_FORMATS = ("sse", "error_map")  # SSE framing; the API error envelopes
SERVER_ROUTERS: dict[str, tuple[str, ...]] = {  # each router and its own formats
    "info_routes": ("props", "rpc_status", "worker"),
    "chat_routes": ("chat_bodies", "schemas", "live_timings", "prompt_progress"),
    "completion_routes": (
        "completion_bodies",
        "completion_job",
        "completion_schema",
        "live_timings",
        "prompt_progress",
    ),
    "responses_api": ("response_store", "responses_events", "responses_schema"),
    "anthropic_api": ("anthropic_events", "anthropic_schema"),
    "slot_routes": ("slot_job",),
    "utility_routes": ("completion_schema", "prompt_limits", "prompt_tokens", "schemas"),
}


def _package_graph(package: str) -> dict[str, set[str]]:
    """Module -> the modules of `package` it imports (type-hint imports included)."""
    root = SRC.joinpath(*package.split("."))
    modules = {_module_name(p): p for p in _sources(root)}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for imported in _imports(path):
            while imported and imported not in modules:  # `pkg.mod.Name` -> `pkg.mod`
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                targets.add(imported)
        graph[name] = targets
    return graph


def test_cycle_finder_sees_a_circle_through_type_hints() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _circles(graph) == [("a", "b", "c")]
    assert _circles({"a": {"b"}, "b": set()}) == []
    source = (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from kvmem.server.app import S\n"
    )
    assert "kvmem.server.app.S" in _imports_in_source(source, "kvmem.server.flow", False)


def test_server_has_no_import_circle() -> None:
    assert _circles(_package_graph(SERVER)) == []


def test_each_server_router_imports_only_the_state_the_flow_and_its_formats() -> None:
    graph = _package_graph(SERVER)
    routers = {f"{SERVER}.{name}" for name in SERVER_ROUTERS}
    assert routers <= set(graph), sorted(routers - set(graph))
    bad = []
    for name, formats in SERVER_ROUTERS.items():
        allowed = {f"{SERVER}.{m}" for m in (*SERVER_FLOW, *SERVER_SHARED_FORMATS, *formats)}
        bad += [f"{name} imports {m}" for m in sorted(graph[f"{SERVER}.{name}"] - allowed)]
    assert bad == []


def test_only_the_app_imports_the_routers_and_the_flow_imports_no_router() -> None:
    graph = _package_graph(SERVER)
    routers = {f"{SERVER}.{name}" for name in SERVER_ROUTERS}
    importers = {m for m, targets in graph.items() if targets & routers}
    assert importers <= {f"{SERVER}.app"}, sorted(importers)
    state_and_flow = {f"{SERVER}.{m}" for m in SERVER_FLOW}
    assert all(not (graph[m] & {f"{SERVER}.app"}) for m in state_and_flow)


WALLED_FROM_SESSION = ("kvmem.engine.transfer", "kvmem.engine.hybrid", "kvmem.engine.query")


def _module_graph() -> dict[str, set[str]]:
    """kvmem's modules and the kvmem modules each imports (type-hint imports included;
    `from pkg import name` counts as the module `pkg.name` when there is one)."""
    paths = {_module_name(p): p for p in _sources(PACKAGE)}
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        deps = set()
        for name in _imports(path):
            while name and name not in paths:
                name = name.rpartition(".")[0]
            if name and name != module:
                deps.add(name)
        graph[module] = deps
    return graph


def _circles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[tuple[str, ...]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                part = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    part.append(member)
                    if member == node:
                        break
                if len(part) > 1:
                    found.append(tuple(sorted(part)))
    return sorted(found)


def test_circle_finder_sees_a_circle_through_type_hints() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _circles(graph) == [("a", "b", "c")]
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .session import S\n"
    names = _imports_in_source(source, "kvmem.engine.spec.spec_decode", is_package=False)
    assert "kvmem.engine.spec.session" in names


def test_no_import_circle_in_any_package() -> None:
    circles = _circles(_module_graph())
    assert circles == []


def test_transfer_hybrid_and_query_never_reach_the_session() -> None:
    graph = _module_graph()
    bad = []
    for module in sorted(graph):
        if not any(_within(module, walled) for walled in WALLED_FROM_SESSION):
            continue
        seen, todo = {module}, [module]
        while todo:  # everything it loads, directly or through others
            for dep in graph[todo.pop()]:
                if dep not in seen:
                    seen.add(dep)
                    todo.append(dep)
        bad.extend(
            f"{module} reaches {m}" for m in sorted(seen) if _within(m, "kvmem.engine.session")
        )
    assert bad == []


def test_cli_imports_no_engine() -> None:
    bad = []
    for path in _sources(PACKAGE / "cli"):
        module = _module_name(path)
        for name in _imports(path):
            if not _within(name, "kvmem.engine"):
                continue
            bad.append(f"{module} imports {name}")
    assert bad == []


def test_engine_package_exports_nothing_and_loads_nothing() -> None:
    """No lazy loader: `kvmem.engine` is a docstring, so importing a record module of it
    loads no llama_cpp and no other engine module."""
    init = PACKAGE / "engine" / "__init__.py"
    tree = ast.parse(init.read_text(encoding="utf-8"))
    assert [type(node).__name__ for node in tree.body] == ["Expr"]
