#!/usr/bin/env bash
# Set up (if needed) and start kvmem-server on the embedded default model at 127.0.0.1:8080.
# Extra arguments go to kvmem-server (llama-server's flags), e.g. scripts/serve.sh --port 9000
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/kvmem-server "$@"
