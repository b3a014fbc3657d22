"""Browser fixtures: Debian's chromium driven by Playwright against real kvmem-server processes.

Chromium comes from the system (scripts/install-chromium.sh, run by scripts/test.sh); no
browser is downloaded. Servers are module-scoped and run the embedded SmolLM2 model.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server.conftest import LiveServer, start_server

UI_KEY = "sk-ui-test-key"
# A fixed seed: the settings test samples at temperature 0.5 and counts the reply's tokens,
# which an unseeded draw can end early with an end-of-generation token.
SERVER_ARGS = (
    "-c",
    "4096",
    "--kvmem-budget",
    "1024",
    "--kvmem-gen-reserve",
    "512",
    "-t",
    "2",
    "--seed",
    "7",
)
DOCS_IMG = Path(__file__).resolve().parents[2] / "docs" / "img"


def chromium_path() -> str:
    found = os.environ.get("KVMEM_CHROMIUM") or shutil.which("chromium")
    if not found:
        raise AssertionError(
            "Debian's chromium is needed for tests/ui: run scripts/install-chromium.sh "
            "(scripts/test.sh does) or set KVMEM_CHROMIUM"
        )
    return found


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(
            executable_path=chromium_path(),
            args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
        )
        yield b
        b.close()


@pytest.fixture(scope="module")
def ui_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    server = start_server(SERVER_ARGS, tmp_path_factory.mktemp("ui-server"))
    yield server
    assert server.stop() == 0, server.log()[-3000:]


@pytest.fixture(scope="module")
def ui_auth_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    server = start_server(
        (*SERVER_ARGS, "--api-key", UI_KEY), tmp_path_factory.mktemp("ui-auth-server")
    )
    yield server
    assert server.stop() == 0, server.log()[-3000:]
