#!/usr/bin/env bash
# Set up (if needed) and run the linters and the whole test suite on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
bash scripts/install-chromium.sh  # Debian's chromium for tests/ui (a no-op when installed)
.venv/bin/ruff check src tests
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
