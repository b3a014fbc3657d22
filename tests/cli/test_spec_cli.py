"""kvmem-cli speculative flags: invalid values fail before the model loads; prompt-lookup
drafts leave the greedy answer unchanged (a real SmolLM2 run with and without drafts)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from kvmem.cli import chat_cli
from kvmem.console import chat
from kvmem.engine.llama import model as model_module
from kvmem.spec_config import SpecType


@pytest.fixture
def no_model_load(monkeypatch):
    def refuse(*_args, **_kwargs):
        raise AssertionError("the model was loaded before the flags were validated")

    monkeypatch.setattr(model_module.LlamaModel, "__init__", refuse)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--spec-type", "eagle"], "--spec-type: unknown type 'eagle': use one of none,"),
        (
            ["--spec-type", "draft-mtp"],
            "--spec-type: draft-mtp needs a model with an MTP (nextn) head",
        ),
        (["--spec-type", "ngram-simple", "--spec-draft-n-max", "0"], "must be in 1..16, got 0"),
        (["--spec-type", "ngram-simple", "--spec-draft-n-max", "2.5"], "invalid integer value"),
        (["--spec-draft-n-max", "4"], "--spec-draft-n-max: needs --spec-type"),
        (["--spec-type", "ngram-simple", "--spec-kv-dtype", "q8_0"], "draft-mtp only"),
        (["--spec-type", "draft-mtp", "--spec-kv-dtype", "q4_0"], "use f16 or q8_0"),
    ],
)
def test_invalid_spec_flags_fail_before_loading(args, message, capsys, no_model_load):
    rc = chat.main(["-p", "hi", *args])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert message in err


@pytest.mark.parametrize("name", ["ngram-simple", "draft-ngram"])
def test_llama_cpp_name_and_alias_are_accepted(name, no_model_load):
    ns = chat_cli.build_parser().parse_args(["--spec-type", name, "--spec-draft-n-max", "5"])
    spec = chat_cli.settings_from_args(ns).spec
    assert (spec.type, spec.n_max) == (SpecType.NGRAM, 5)


CODE = (
    "File shapes.py:\n"
    "def area(width, height):\n    return width * height\n\n"
    "def perimeter(width, height):\n    return 2 * (width + height)\n\n"
    "Write shapes.py again, unchanged:\n"
    "def area(width, height):\n"
)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvmem.console.chat", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_drafts_keep_the_greedy_answer(tmp_path):
    prompt = tmp_path / "code.txt"
    prompt.write_text(CODE)
    common = ("-f", str(prompt), "--raw", "-n", "40", "--ignore-eos", "--temp", "0", "-t", "1")
    plain = _cli(*common)
    drafted = _cli(*common, "--spec-type", "ngram-simple", "--no-spec-gate", "--kvmem-trace")
    assert plain.returncode == 0 and drafted.returncode == 0, drafted.stderr
    assert drafted.stdout == plain.stdout
    assert drafted.stdout.startswith("def perimeter(width, height):\n")
    m = re.search(r"KVMEM_GEN tokens=40 .* draft_n=(\d+) draft_accepted=(\d+)", drafted.stderr)
    assert m is not None, drafted.stderr[-2000:]
    assert 10 < int(m.group(2)) <= int(m.group(1))


@pytest.mark.slow
def test_mtp_drafts_keep_the_greedy_answer(tmp_path):
    from tests.engine.hybrid_models import write_echo_head_hybrid

    model = write_echo_head_hybrid(tmp_path)
    prompt = tmp_path / "code.txt"
    prompt.write_text(CODE)
    common = ("-m", str(model), "-f", str(prompt), "--raw", "-n", "40", "--ignore-eos")
    common += ("--temp", "0", "-t", "1", "-c", "1024")
    plain = _cli(*common)
    drafted = _cli(
        *common, "--spec-type", "draft-mtp", "--spec-kv-dtype", "q8_0", "--no-spec-gate",
        "--kvmem-trace",
    )  # fmt: skip
    assert plain.returncode == 0 and drafted.returncode == 0, drafted.stderr[-2000:]
    assert drafted.stdout == plain.stdout and drafted.stdout
    m = re.search(r"KVMEM_GEN tokens=40 .* draft_n=(\d+) draft_accepted=(\d+)", drafted.stderr)
    assert m is not None, drafted.stderr[-2000:]
    assert 0 < int(m.group(2)) < int(m.group(1))  # the echo head's drafts: some accepted
