"""Engine test fixtures."""

from __future__ import annotations

import pytest

from kvmem.sampling import SamplingParams

from .helpers import GREEDY


@pytest.fixture(scope="module")
def greedy() -> SamplingParams:
    return GREEDY
