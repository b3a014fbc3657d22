#!/usr/bin/env bash
# Issue 34 on the CPU: one tool loop over two code trees side by side (A/B in one call, the same
# load for both), on the synthetic 16-layer, 1024-wide q8_0 model of scripts/cpu-tools-loop.sh.
#
#   scripts/cpu-tools-loop-ab.sh SRC_A SRC_B [OUT]     SRC_*: a checkout's src/ folder
#
# Environment: CTX [10240], BUDGET [4096], ROUNDS [4], GEN [8], HARVEST [8192], NICE [10].
set -u
cd "$(dirname "$0")/.."
A=$1 B=$2 OUT=${3:-/tmp/loop-ab}
CTX=${CTX:-10240} BUDGET=${BUDGET:-4096} ROUNDS=${ROUNDS:-4} GEN=${GEN:-8}
HARVEST=${HARVEST:-8192} NICE=${NICE:-10}
BIN=$(dirname "$(command -v python3)")
[ -x .venv/bin/kvmem-server ] && BIN=.venv/bin
MODEL=$OUT/m16.gguf
mkdir -p "$OUT"
if [ ! -f "$MODEL" ]; then
  "$BIN/kvmem-bench" synth-model "$MODEL" --n-layer 16 --n-embd 1024 --n-head 16 \
    --n-head-kv 8 --n-ff 1024 --n-ctx-train 131072 --threads 2 || exit 1
fi
pids=() args=() port=18700
for src in "$A" "$B"; do
  port=$((port + 1))
  label=$(basename "$(dirname "$src")")
  PYTHONPATH=$src nice -n "$NICE" "$BIN/kvmem-server" -m "$MODEL" -c "$CTX" \
    --kvmem-budget "$BUDGET" --kvmem-gen-reserve 256 --kv-dtype q8_0 -fa on --metrics -t 2 \
    --port "$port" --kvmem-query-source scoring --kvmem-query-ahead on \
    --kvmem-harvest-tokens "$HARVEST" > "$OUT/server-$label.log" 2>&1 &
  pids+=($!)
  args+=(--url "http://127.0.0.1:$port" --label "$label" --server-pid "$!")
done
nice -n "$NICE" "$BIN/kvmem-bench" tools "${args[@]}" --wait 300 --ignore-eos \
  --rounds "$ROUNDS" --target-tokens $((CTX * 7 / 8)) --gen-tokens "$GEN" --out "$OUT" \
  > "$OUT/tools.txt" 2>&1
rc=$?
for pid in "${pids[@]}"; do kill "$pid"; done
wait
sed -n '/tool loop: what the turns waited for/,$p' "$OUT/tools.txt"
exit $rc
