"""Run llama.cpp's server test suite (from the llama-cpp-python 0.3.36 sdist) against kvmem-server.

    python tests/conformance/suite.py [--files test_basic ...] [--cache DIR] [--server PATH]

The sdist is downloaded with pip (`pip download --no-deps --no-binary :all:
llama-cpp-python==0.3.36`) into the cache directory and `tools/server/tests` (plus the
`models/templates` its template tests read) is extracted there; nothing of it is kept in
this repository. The suite runs as it is (`-m "not slow"`) with LLAMA_SERVER_BIN_PATH
pointing at a wrapper of `launcher.py`, which only maps the download flags to the local
SmolLM2-135M-Instruct file. Prints one line per test and the pass count. `--server PATH`
runs the same suite, with the same launcher mapping, against another server binary (a real
llama-server, for the comparison of scripts/conformance-compare.sh).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

VERSION = "0.3.36"
SDIST = f"llama_cpp_python-{VERSION}.tar.gz"
VENDOR = f"llama_cpp_python-{VERSION}/vendor/llama.cpp"
HERE = Path(__file__).resolve().parent
DEFAULT_CACHE = Path(os.environ.get("KVMEM_CONFORMANCE_CACHE", "/tmp/kvmem-conformance"))

ALL_FILES = (
    "test_basic", "test_security", "test_chat_completion", "test_tool_call", "test_completion",
    "test_tokenize", "test_template", "test_metrics", "test_ctx_shift", "test_slot_save",
    "test_stream", "test_ignore_eos",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Outcome:
    test: str
    outcome: str  # passed | failed | error | skipped
    message: str = ""


def fetch_suite(cache: Path) -> Path:
    """The extracted `tools/server/tests` directory (downloaded and extracted once)."""
    tests = cache / VENDOR / "tools" / "server" / "tests"
    if (tests / "utils.py").is_file():
        return tests
    cache.mkdir(parents=True, exist_ok=True)
    archive = cache / SDIST
    if not archive.is_file():
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
             f"llama-cpp-python=={VERSION}", "-d", str(cache)],
            check=True,
        )  # fmt: skip
    wanted = (f"{VENDOR}/tools/server/tests/", f"{VENDOR}/models/templates/")
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(wanted)]
        tar.extractall(cache, members=members, filter="data")
    return tests


def smollm2_path() -> str:
    sys.path.insert(0, str(HERE.parent.parent / "src"))
    from kvmem.gguf.model_path import default_model_path

    return str(default_model_path())


def server_command() -> str:
    script = Path(sys.executable).with_name("kvmem-server")
    found = str(script) if script.exists() else shutil.which("kvmem-server")
    if not found:
        raise SystemExit("kvmem-server is not installed in this environment")
    return found


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_wrapper(cache: Path) -> Path:
    wrapper = cache / "kvmem-llama-server"
    text = f'#!/bin/sh\nexec "{sys.executable}" "{HERE / "launcher.py"}" "$@"\n'
    if not wrapper.is_file() or wrapper.read_text() != text:  # another run may be using it
        wrapper.write_text(text)
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return wrapper


def run_suite(
    files: tuple[str, ...] = ALL_FILES,
    cache: Path = DEFAULT_CACHE,
    extra_args: tuple[str, ...] = (),
    timeout: float | None = None,
    server: str | None = None,
) -> list[Outcome]:
    """The suite's outcomes against `server` (a binary path; kvmem-server when None)."""
    tests = fetch_suite(cache)
    label = Path(server).name if server else "kvmem-server"
    report = cache / f"report-{label}.xml"
    report.unlink(missing_ok=True)
    env = {
        **os.environ,
        "LLAMA_SERVER_BIN_PATH": str(write_wrapper(cache)),
        "KVMEM_CONFORMANCE_MODEL": smollm2_path(),
        "KVMEM_CONFORMANCE_SERVER": str(Path(server).resolve()) if server else server_command(),
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        "PORT": str(_free_port()),  # the suite's utils.py reads it (default 8080)
    }
    cmd = [
        sys.executable, "-m", "pytest", "-q", "-p", "conformance_plugin", "-p", "no:cacheprovider",
        "-m", "not slow", f"--junitxml={report}", "-o", "junit_family=xunit1",
        *(f"unit/{name}.py" for name in files), *extra_args,
    ]  # fmt: skip
    with (cache / f"pytest-{label}.log").open("wb") as log:
        subprocess.run(cmd, cwd=tests, env=env, timeout=timeout, stdout=log, stderr=log)
    return parse_report(report)


def parse_report(path: Path) -> list[Outcome]:
    outcomes = []
    for case in ET.parse(path).getroot().iter("testcase"):
        if not case.get("name"):
            continue  # the entry pytest adds for an interrupted run
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed"}.get(child.tag, child.tag)
                message = (
                    (child.get("message") or "").splitlines()[0][:200]
                    if child.get("message")
                    else ""
                )
                break
        outcomes.append(Outcome(name, outcome, message))
    return outcomes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", nargs="*", default=list(ALL_FILES))
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--json", type=Path, help="write the outcomes as JSON")
    parser.add_argument("-k", help="pytest -k expression")
    parser.add_argument("--server", help="the server binary to test (default: kvmem-server)")
    parser.add_argument(
        "--deselect", action="append", default=[], metavar="NODEID",
        help="a test to leave out (pytest --deselect, e.g. unit/test_x.py::test_y[p]); repeatable",
    )  # fmt: skip
    args = parser.parse_args()
    extra = ("-k", args.k) if args.k else ()
    extra += tuple(arg for node in args.deselect for arg in ("--deselect", node))
    outcomes = run_suite(tuple(args.files), args.cache, extra, server=args.server)
    for o in outcomes:
        print(f"{o.outcome:7} {o.test}  {o.message}")
    passed = sum(o.outcome == "passed" for o in outcomes)
    ran = sum(o.outcome != "skipped" for o in outcomes)
    print(f"passed {passed} of {ran} (skipped {len(outcomes) - ran})")
    if args.json:
        rows = [{"test": o.test, "outcome": o.outcome, "message": o.message} for o in outcomes]
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
