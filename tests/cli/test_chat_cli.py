"""kvmem-cli: invalid flags fail before the model loads; real runs on SmolLM2."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from kvmem.cli import chat_cli
from kvmem.console import chat
from kvmem.engine.llama import model as model_module


@pytest.fixture
def no_model_load(monkeypatch):
    """Any attempt to load weights fails the test."""

    def refuse(*_args, **_kwargs):
        raise AssertionError("the model was loaded before the flags were validated")

    monkeypatch.setattr(model_module.LlamaModel, "__init__", refuse)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--kvmem-budget", "256"], "--kvmem-budget: 256 tokens is smaller than sink + recent"),
        (["--kvmem-budget", "0"], "--kvmem-budget: must be a positive number, got 0"),
        (["--kvmem-budget", "1k"], "argument --kvmem-budget: invalid integer value: '1k'"),
        (
            ["--kvmem-gen-reserve", "64"],
            "--kvmem-gen-reserve: 64 tokens is smaller than one block (128 tokens)",
        ),
        (
            ["--kvmem-block-tokens", "100"],
            "--kvmem-block-tokens: must be a multiple of 32, got 100",
        ),
        (
            ["-ctk", "q9_0"],
            "-ctk: unknown KV cache type 'q9_0'; expected one of f32, f16, q4_0, q5_0, q8_0",
        ),
        (["-ctv", "bf17"], "-ctv: unknown KV cache type 'bf17'"),
        (["--kv-dtype", "int4"], "--kv-dtype: unknown KV cache type 'int4'"),
        (
            ["-ctk", "q8_0", "-ctv", "f16"],
            "-ctk/-ctv: K/V cache types q8_0/f16 mix a float and a quantized type",
        ),
        (
            ["--kv-dtype", "f16", "-ctv", "q4_0"],
            "K/V cache types f16/q4_0 mix a float and a quantized type",
        ),
        (["--kvmem-method", "random"], "argument --kvmem-method: invalid choice: 'random'"),
        (["--kvmem-query-replay", "sometimes"], "argument --kvmem-query-replay: invalid choice"),
        (["--kvmem-positions", "shuffle"], "argument --kvmem-positions: invalid choice: 'shuffle'"),
        (
            ["--kvmem-query-max-tokens", "-5"],
            "--kvmem-query-max-tokens: must be a positive number, got -5",
        ),
        (["-c", "-1"], "-c: context size must be positive, got -1"),
        (["-n", "0"], "-n: must be -1 or a positive number, got 0"),
        (["-n", "-2"], "-n: must be -1 or a positive number, got -2"),
        (["--temp", "-1"], "--temp: must be >= 0, got -1.0"),
        (["--temp", "hot"], "argument --temp: invalid number: 'hot'"),
        (["-t", "0"], "-t: must be a positive number, got 0"),
        (["-ngl", "many"], "-ngl: expected a number, 'all' or 'auto', got 'many'"),
        (["-m", "/nonexistent/model.gguf"], "-m: model file not found: /nonexistent/model.gguf"),
        (["-f", "/nonexistent/prompt.txt"], "-f: prompt file not found"),
        (["--bogus-flag"], "unrecognized arguments: --bogus-flag"),
        (["-f", "/dev/null", "-p", "x"], "-f: give either -p or -f, not both"),
    ],
)
def test_invalid_flags_fail_before_loading(args, message, capsys, no_model_load):
    prompt = [] if "-f" in args else ["-p", "hi"]
    rc = chat.main([*prompt, *args])
    err = capsys.readouterr().err
    assert rc == 2
    assert message in err
    assert err.startswith("kvmem-cli: error: ")


def test_valid_quantized_pairs_are_accepted(no_model_load):
    for k in ("q8_0", "q5_0", "q4_0"):
        for v in ("q8_0", "q5_0", "q4_0"):
            ns = chat_cli.build_parser().parse_args(["-ctk", k, "-ctv", v])
            settings = chat_cli.settings_from_args(ns)
            assert (settings.cache_types.k.label, settings.cache_types.v.label) == (k, v)


def _cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvmem.console.chat", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_one_shot_answer_with_trace():
    run = _cli(
        "-p", "What is the capital city of Japan?", "-n", "24", "--temp", "0", "--kvmem-trace"
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "The capital city of Japan is Tokyo."
    assert "KVMEM_PREFILL tokens=" in run.stderr and "KVMEM_GEN tokens=" in run.stderr


def test_prompt_longer_than_context_is_a_clear_error(tmp_path):
    prompt = tmp_path / "long.txt"
    prompt.write_text("the grass is green and the sky is blue. " * 200)
    run = _cli("-f", str(prompt), "-c", "512", "--raw", "-n", "8")
    assert run.returncode == 1
    assert "exceeds the available context size (512 tokens)" in run.stderr
    assert "Traceback" not in run.stderr


def test_long_generation_spills_past_the_reserve(tmp_path):
    # a ~1.1K-token history fills the 1024-token budget, so the 600 new tokens only have the
    # 256-token reserve: the oldest blocks of the generation spill to the host store
    prompt = tmp_path / "history.txt"
    prompt.write_text("The grass is green. The sky is blue. The sun is yellow. " * 90)
    run = _cli(
        "-f",
        str(prompt),
        "--raw",
        "-n",
        "600",
        "--ignore-eos",
        "--temp",
        "0",
        "-c",
        "8192",
        "--kvmem-budget",
        "1024",
        "--kvmem-gen-reserve",
        "256",
        "--kvmem-trace",
        timeout=600,
    )
    assert run.returncode == 0, run.stderr
    assert "KVMEM_SPILL" in run.stderr
    gen = [ln for ln in run.stderr.splitlines() if ln.startswith("KVMEM_GEN")][-1]
    assert "tokens=600" in gen and "finish=length" in gen
    cells = int(gen.split("cells=")[1].split()[0])
    assert cells <= 1024 + 256


def _bar_counts(stderr: str) -> list[int]:
    """The `done` of each drawing of the `prompt` bar (tqdm's `prompt: 33%|...| 32/97 [...]`)."""
    return [int(m) for m in re.findall(r"prompt:\s+\d+%\|[^|]*\| (\d+)/\d+", stderr)]


def test_forced_progress_bar_counts_each_chunk_and_the_cap_is_marked(tmp_path):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("The grass is green. The sky is blue. " * 8)
    common = ("-f", str(prompt), "--raw", "-n", "2", "--ignore-eos", "--temp", "0", "-b", "32")
    run = _cli(*common, "-ub", "32", "--progress-bar", "--kvmem-trace")
    assert run.returncode == 0, run.stderr
    n = int(re.search(r"KVMEM_PREFILL tokens=(\d+)", run.stderr).group(1))
    assert n > 64
    assert _bar_counts(run.stderr) == [0, *range(32, n, 32), n]
    assert re.search(rf"prompt: 100%\|[^|]*\| {n}/{n} \[", run.stderr)
    assert run.stderr.rstrip().endswith("[cut at the -n cap of 2 tokens]")
    assert "[cut" not in run.stdout  # one-shot stdout stays the generated text
    plain = _cli(*common)  # stderr is a pipe: no bar unless forced
    assert plain.returncode == 0, plain.stderr
    assert "prompt:" not in plain.stderr and "%|" not in plain.stderr
    assert plain.stdout == run.stdout
    assert plain.stderr.strip() == "[cut at the -n cap of 2 tokens]"


def test_chat_at_the_context_drops_the_oldest_turns_and_goes_on(tmp_path):
    save = tmp_path / "chat.json"
    questions = [f"Question {i}: name one color of the rainbow." for i in range(4)]
    stdin = "\n".join([*questions, "", f"/save {save}", "/exit"]) + "\n"  # "": no command
    run = subprocess.run(
        [sys.executable, "-m", "kvmem.console.chat", "-i", "-c", "160", "-n", "16"]
        + ["--ignore-eos", "--temp", "0", "--no-kvmem", "-t", "1"],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.count("[cut at the -n cap of 16 tokens]") == len(questions)
    drops = [
        int(k)
        for k in re.findall(
            r"\(the conversation reached the 160-token context: the oldest (\d+) messages were "
            r"dropped\)",
            run.stdout,
        )
    ]
    assert drops and all(k % 2 == 0 for k in drops)  # whole turns: a question and its reply
    doc = json.loads(save.read_text())
    assert doc["n_ctx"] == 160 and doc["model"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
    messages = doc["messages"]
    assert len(messages) == 2 * len(questions) - sum(drops)
    assert [m["role"] for m in messages] == ["user", "assistant"] * (len(messages) // 2)
    assert [m["content"] for m in messages[::2]] == questions[-(len(messages) // 2) :]
    assert f"(saved {len(messages)} messages to {save})" in run.stdout
