#!/usr/bin/env bash
# Aggregate decode tok/s of 1, 2 and 4 concurrent --parallel lanes (issue 13) on one GPU:
# Qwen2.5-Coder-0.5B ($QWEN_GGUF), all layers on the GPU, f16 KV, budget 4096 + reserve
# 512 per lane, 256 greedy tokens per lane (EOG banned), one client thread per lane.
# Then the plain-llama.cpp baseline (no KVMem) of the two lane designs on the same weights:
# N sequence ids batched in ONE context (one llama_decode per step) vs N contexts decoding
# on N threads, for N = 1, 2, 4, with the ratio seq ids / contexts from this one run.
# Prints both tables and writes "$OUT"/lanes.json (whole script: well under 4 minutes).
# CPU smoke run: LANES_MODEL=path.gguf LANES_NGL=0 LANES_TOKENS=16 LANES_BUDGET=1024.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:?set OUT to the output directory}
MODEL=${LANES_MODEL:-${QWEN_GGUF:?set QWEN_GGUF to the Qwen2.5-Coder-0.5B GGUF}}
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$OUT"
timeout 220 "$PY" -m kvmem.bench.main lanes -m "$MODEL" --lanes "${LANES_COUNTS:-1,2,4}" \
  --gen-tokens "${LANES_TOKENS:-256}" -ngl "${LANES_NGL:-all}" -c 8192 \
  --budget "${LANES_BUDGET:-4096}" --gen-reserve 512 ${LANES_THREADS:+-t "$LANES_THREADS"} \
  --out "$OUT"
