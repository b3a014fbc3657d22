"""llama.cpp's own server tests (llama-cpp-python 0.3.36 sdist) against kvmem-server.

Runs the files whose outcome does not depend on the reference model's exact text (see
docs/server.md, "llama-server conformance"), through `suite.py`: the sdist is downloaded
with pip at test time and nothing of it is kept in this repository.
"""

from __future__ import annotations

import pytest

from tests.conformance.suite import run_suite

pytestmark = pytest.mark.slow

CI_FILES = ("test_template", "test_tokenize")
MIN_PASSED = 37  # of 38; the one failure (test_tokenize_with_bos) is explained in docs/server.md


def test_model_independent_files_pass() -> None:
    outcomes = run_suite(CI_FILES, timeout=600)
    failed = [f"{o.test}: {o.message}" for o in outcomes if o.outcome in ("failed", "error")]
    passed = sum(o.outcome == "passed" for o in outcomes)
    assert passed >= MIN_PASSED, "\n".join(failed)
