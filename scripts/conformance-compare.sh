#!/usr/bin/env bash
# Run llama.cpp's server suite (tests/conformance/suite.py: the llama-cpp-python 0.3.36 sdist's
# tools/server/tests, the same launcher mapping, SmolLM2-135M-Instruct) against a real
# llama-server and against kvmem-server, then compare them file by file (docs/conformance.md).
#   scripts/conformance-compare.sh LLAMA_SERVER_PATH [OUT_DIR] [-- suite.py args, e.g. --files test_security]
# Build llama-server (CPU) from the same sdist's vendor/llama.cpp, e.g.:
#   cmake -S vendor/llama.cpp -B /tmp/llama-build -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
#     -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DCMAKE_BUILD_TYPE=Release
#   cmake --build /tmp/llama-build --target llama-server -j2
# Writes OUT_DIR/llama-server.json, OUT_DIR/kvmem-server.json and OUT_DIR/compare.md; exits 1
# when kvmem-server passes fewer tests than llama-server.
set -euo pipefail
cd "$(dirname "$0")/.."
llama_server="${1:?usage: scripts/conformance-compare.sh LLAMA_SERVER_PATH [OUT_DIR] [-- suite args]}"
shift
out="/tmp/kvmem-conformance/compare"
if [ $# -gt 0 ] && [ "$1" != "--" ]; then out="$1"; shift; fi
[ "${1:-}" = "--" ] && shift
[ -x "$llama_server" ] || { echo "not an executable: $llama_server" >&2; exit 2; }
python="${PYTHON:-.venv/bin/python}"
mkdir -p "$out"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
"$python" tests/conformance/suite.py --server "$llama_server" --json "$out/llama-server.json" "$@" \
  > "$out/llama-server.txt"
tail -n 1 "$out/llama-server.txt"
"$python" tests/conformance/suite.py --json "$out/kvmem-server.json" "$@" > "$out/kvmem-server.txt"
tail -n 1 "$out/kvmem-server.txt"
"$python" tests/conformance/compare.py "$out/llama-server.json" "$out/kvmem-server.json" \
  | tee "$out/compare.md"
