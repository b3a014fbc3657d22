#!/usr/bin/env bash
# Set up (if needed) and start kvmem-server on the embedded default model at 127.0.0.1:8080.
# KVMem at work from the first chat: the embedded model's 8K context with a 2K + 512 KVMem
# window (the cpu-smollm2 recipe's), so a chat that outgrows 2K tokens retrieves from its
# history (the page shows the retrieved tokens of each turn), and the KVMEM_* trace records
# on stderr. Extra arguments go to kvmem-server after these (llama-server's flags; a later
# flag wins), e.g. scripts/serve.sh --port 9000, or --kvmem-budget 32768 for a larger window.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/kvmem-server --kvmem-budget 2048 --kvmem-gen-reserve 512 --kvmem-trace "$@"
