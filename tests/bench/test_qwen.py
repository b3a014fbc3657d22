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
            "kvmem.console.chat",
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


@pytest.fixture(scope="module")
def qwen_engine(qwen_path: Path):
    from kvmem.bench.engines import BenchSettings, LlamaEngineFactory, Method

    engine = LlamaEngineFactory(BenchSettings(str(qwen_path), n_ctx=2048, n_threads=2)).open(
        Method.FULL
    )
    yield engine
    engine.close()


@pytest.mark.parametrize("layout", ["document", "tools", "agent"])
def test_needle_span_holds_exactly_the_needle_in_qwens_rendering(qwen_engine, layout: str) -> None:
    from kvmem.bench.needle import build_prompts
    from kvmem.bench.needle_data import Layout, NeedleKind, NeedleSpec

    spec = NeedleSpec(NeedleKind.MULTIKEY, Layout(layout), 900, 0.5, 0)
    [(case, prompt, span)] = build_prompts([spec], qwen_engine)
    assert span is not None
    assert qwen_engine.detokenize(prompt.tokens[span.start : span.end]).strip() == case.needle
    before = qwen_engine.detokenize(prompt.tokens[span.start - 1 : span.start])
    assert case.needle[:3] not in before


def test_agent_loop_case_renders_real_tool_calls_and_full_context_answers(qwen_engine) -> None:
    from kvmem.bench.engines import ask
    from kvmem.bench.needle import build_prompts, is_correct
    from kvmem.bench.needle_data import Layout, NeedleKind, NeedleSpec

    spec = NeedleSpec(NeedleKind.PASSKEY, Layout.AGENT, 900, 0.5, 0)
    [(case, prompt, _)] = build_prompts([spec], qwen_engine)
    assert abs(len(prompt.tokens) - 900) < 40
    tool_call = qwen_engine.tokenize("<tool_call>", parse_special=True)
    assert len(tool_call) == 1  # Qwen's own special token, in the history and the prefix
    prefix = qwen_engine.tokenize(case.answer_prefix, parse_special=True)
    assert prompt.tokens[-len(prefix) :] == prefix and prefix[0] == tool_call[0]
    rounds = (len(case.messages) - 2) // 2
    assert prompt.text.count("<tool_call>") == rounds + 2  # + two in the template's tool hint
    assert prompt.text.count("<tool_response>") == rounds
    assert prompt.query is not None  # the task, the only user message
    task = qwen_engine.detokenize(prompt.tokens[prompt.query.start : prompt.query.end])
    assert task == case.messages[1].content
    answer = ask(qwen_engine, prompt, 8)
    assert is_correct(answer.text, case.expected), answer.text
