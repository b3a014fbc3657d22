"""`kvmem-bench lookup-drafts`: the prompt, flag validation, and a short real run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvmem.bench.lookup_drafts import rewrite_messages, source_file
from kvmem.bench.main import main


def test_prompt_shows_the_file() -> None:
    text = source_file(3)
    assert text.count("\n\ndef shape_") == 3
    assert "def shape_2_area(width, height):\n" in text and "scale = 4\n" in text
    messages = rewrite_messages(3)
    assert [m["role"] for m in messages] == ["system", "user"]
    assert text in messages[1]["content"] and "renaming `width` to `w`" in messages[1]["content"]


def test_invalid_flags_fail_before_loading(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lookup-drafts", "-m", "/nonexistent.gguf", "--n-min", "0"]) == 2
    assert "need 1 <= n_min <= n_max" in capsys.readouterr().err
    assert main(["lookup-drafts", "-m", "/nonexistent.gguf", "--max-tokens", "0"]) == 2
    assert "--max-tokens: must be positive" in capsys.readouterr().err


@pytest.mark.llama
@pytest.mark.model
@pytest.mark.slow
def test_short_run_is_identical(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["lookup-drafts", "--max-tokens", "24", "--functions", "2", "-t", "1"]
    assert main([*argv, "-c", "1024", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "identical: True" in out
    data = json.loads((tmp_path / "lookup_drafts.json").read_text())
    assert data["identical"] is True
    plain, drafted = data["runs"]["plain"], data["runs"]["drafted"]
    assert plain["tokens"] == drafted["tokens"] and len(plain["tokens"]) <= 24
    assert drafted["steps"] <= plain["steps"] + 1
    assert 0 <= drafted["accepted"] <= drafted["drafted"]
