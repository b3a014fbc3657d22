#!/usr/bin/env bash
# Set up (if needed) and run the linters and the whole test suite on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
.venv/bin/ruff check src tests
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
