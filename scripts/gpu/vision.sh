#!/usr/bin/env bash
# Vision mechanics on the GPU (issue 12): image encode time and the decode rate in a 32K
# window with and without one image in it. Runs from the repo root in < 3 minutes.
# The projector is the random-weight one of `kvmem-bench synth-mmproj`, matched to the
# model (CLIP-like 336 px / 14 px patches: 576 rows per image): the numbers are the
# mechanics' cost, not a real vision model's. Model: Qwen2.5-Coder-0.5B ($QWEN_GGUF).
# Writes "$OUT"/vision.json. CPU-sized check (64-row images):
#   CONTEXT=1024 GEN=4 THREADS=2 IMAGE_ARGS="--image-size 112" bash scripts/gpu/vision.sh
set -euo pipefail
OUT="${OUT:-/tmp/kvmem-gpu-out}"
MODEL="${QWEN_GGUF:-}"
CONTEXT="${CONTEXT:-32768}"
GEN="${GEN:-128}"
PY="${PYTHON:-python3}"
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$OUT"
read -r -a image_args <<< "${IMAGE_ARGS:-}"
args=(vision --context "$CONTEXT" --gen "$GEN" --images 3 --json-out "$OUT" "${image_args[@]}")
[ -n "$MODEL" ] && args+=(--model "$MODEL")
[ -n "${THREADS:-}" ] && args+=(-t "$THREADS")
echo "== kvmem-bench ${args[*]}"
"$PY" -m kvmem.bench.main "${args[@]}" 2> "$OUT/vision.log" || { tail -40 "$OUT/vision.log"; exit 1; }
echo "== projector on the CPU (--no-mmproj-offload), encode only"
"$PY" -m kvmem.bench.main vision --context "$(( CONTEXT < 2048 ? CONTEXT : 2048 ))" --gen 8 --images 3 --no-mmproj-offload "${image_args[@]}" \
  ${MODEL:+--model "$MODEL"} --json-out "$OUT/cpu-projector" 2>> "$OUT/vision.log" \
  || { tail -40 "$OUT/vision.log"; exit 1; }
echo "wrote $OUT/vision.json and $OUT/cpu-projector/vision.json"
