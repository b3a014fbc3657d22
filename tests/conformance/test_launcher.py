"""The conformance launcher maps only the suite's download flags to the local model."""

from __future__ import annotations

from tests.conformance.launcher import map_argv

MODEL = "/models/smollm2.gguf"


def test_download_flags_become_the_local_model() -> None:
    argv = ["--port", "8080", "--hf-repo", "ggml-org/x", "--hf-file", "a.gguf", "--offline",
            "--ctx-size", "512", "--no-slots"]  # fmt: skip
    assert map_argv(argv, MODEL) == [
        "-m",
        MODEL,
        "--port",
        "8080",
        "--ctx-size",
        "512",
        "--no-slots",
    ]


def test_everything_else_is_passed_unchanged() -> None:
    argv = ["--model", "/other.gguf", "--hf-repo", "r", "--embedding", "--jinja"]
    assert map_argv(argv, MODEL) == ["--model", "/other.gguf", "--embedding", "--jinja"]
    assert map_argv(["--port", "1"], MODEL) == ["--port", "1"]  # no download flag, no model
