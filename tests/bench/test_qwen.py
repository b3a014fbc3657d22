"""The real model: Qwen2.5-Coder-0.5B-Instruct from its six PyPI parts (the `qwen` extra).

`-m qwen-0.5b` resolves to the joined, verified GGUF in every front-end; the model loads
and answers a tiny prompt. Prompts stay tiny: the model prefills at ~100 tok/s on 2 cores.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvmem.bench.main import main as bench_main
from kvmem.cli.server_config import load_server_settings
from kvmem.models import QWEN_05B, default_cache_dir, ensure_model, is_verified

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def qwen_path() -> Path:
    return ensure_model(QWEN_05B)


def test_models_command_prints_the_verified_path(
    qwen_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert bench_main(["models", "qwen-0.5b"]) == 0
    assert capsys.readouterr().out == f"{qwen_path}\n"
    assert qwen_path == default_cache_dir() / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    assert qwen_path.stat().st_size == 491_400_064
    assert is_verified(QWEN_05B, qwen_path)
    with qwen_path.open("rb") as handle:
        assert handle.read(4) == b"GGUF"


def test_server_flag_resolves_the_name(qwen_path: Path) -> None:
    settings, _ = load_server_settings(["-m", "qwen-0.5b", "-ngl", "all"], {})
    assert settings.engine.model_path == str(qwen_path)
    assert settings.engine.n_gpu_layers == -1


def test_cli_loads_qwen_by_name_and_answers(qwen_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvmem.cli.chat_cli",
            "-m",
            "qwen-0.5b",
            "-ngl",
            "all",
            "-c",
            "1024",
            "-t",
            "2",
            "--temp",
            "0",
            "-n",
            "6",
            "-p",
            "What is 17 + 25? Reply with the number only.",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "42"
