#!/usr/bin/env bash
# Set up (if needed) and run the linters and the whole test suite on the CPU.
#   scripts/test.sh [PYTEST ARGS]         everything (what CI runs)
#   scripts/test.sh --fast [PYTEST ARGS]  ruff, then the tests that need neither llama_cpp nor a
#                                         model (-m "not llama and not model"; tests/markers.py)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--fast" ]; then
  shift
  [ -x .venv/bin/python ] || bash scripts/setup.sh test
  .venv/bin/ruff check src tests
  exec .venv/bin/python -m pytest -q -p no:cacheprovider -m "not llama and not model" "$@"
fi
bash scripts/setup.sh test
bash scripts/install-chromium.sh  # Debian's chromium for tests/ui (a no-op when installed)
.venv/bin/ruff check src tests
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
