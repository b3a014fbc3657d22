#!/usr/bin/env bash
# Issue 34 on the CPU: the tool loop on a synthetic 16-layer, 1024-wide model (q8_0 weights
# and KV, flash attention), one kvmem-server per --kvmem-harvest-tokens value and per code
# tree, their rounds interleaved by one `kvmem-bench tools` call (same load for every one).
#
#   scripts/cpu-tools-loop.sh [OUT]    OUT default /tmp/tools-loop
#   SRCS="../a/src ../b/src" HARVEST=8192 scripts/cpu-tools-loop.sh OUT    (an A/B of two trees)
#
# Environment (defaults in brackets): HARVEST ["0 4096 8192"], CTX [8192], BUDGET [4096],
# ROUNDS [3], GEN [8], THREADS [2], NICE [10], MODEL [$OUT/m16.gguf, written if missing],
# EXTRA [more kvmem-server flags for every server, e.g. "--kvmem-trace"],
# SRCS [this checkout's code; else checkouts' src/ folders, labelled by their folder],
# VARIANTS [none; else names V, one server each per tree and harvest, with the flags in
# FLAGS_V, labelled by V: VARIANTS="gen auto" FLAGS_gen="--kvmem-restore-ahead generation"].
# The loop targets 7/8 of CTX: the characters-per-token estimate is ~5% off on small plans.
# The last table of OUT/tools.txt is the report (docs/benchmarks.md, `tools`).
set -u
cd "$(dirname "$0")/.."
OUT=${1:-/tmp/tools-loop}
HARVEST=${HARVEST:-"0 4096 8192"}
CTX=${CTX:-8192} BUDGET=${BUDGET:-4096} ROUNDS=${ROUNDS:-3} GEN=${GEN:-8}
THREADS=${THREADS:-2} NICE=${NICE:-10}
MODEL=${MODEL:-$OUT/m16.gguf}
BIN=$(dirname "$(command -v python3)")
[ -x .venv/bin/kvmem-server ] && BIN=.venv/bin
mkdir -p "$OUT"
if [ ! -f "$MODEL" ]; then
  "$BIN/kvmem-bench" synth-model "$MODEL" --n-layer 16 --n-embd 1024 --n-head 16 \
    --n-head-kv 8 --n-ff 1024 --n-ctx-train 131072 --threads "$THREADS" || exit 1
fi
pids=() args=() port=18600
for src in ${SRCS:-.}; do
  tree=""
  [ "$src" != . ] && tree="$(basename "$(dirname "$src")")-"
  for h in $HARVEST; do
    for v in ${VARIANTS:--}; do
      port=$((port + 1))
      label="${tree}h$h" flags=""
      [ "$v" != - ] && label="${tree}$v-h$h" && flags="FLAGS_$v" && flags=${!flags:-}
      env ${SRCS:+PYTHONPATH=$src} nice -n "$NICE" "$BIN/kvmem-server" -m "$MODEL" -c "$CTX" \
        --kvmem-budget "$BUDGET" --kvmem-gen-reserve 256 --kv-dtype q8_0 -fa on --metrics \
        -t "$THREADS" --port "$port" --kvmem-query-source scoring --kvmem-query-ahead on \
        --kvmem-harvest-tokens "$h" ${EXTRA:-} $flags > "$OUT/server-$label.log" 2>&1 &
      pids+=($!)
      args+=(--url "http://127.0.0.1:$port" --label "$label" --server-pid "$!")
    done
  done
done
nice -n "$NICE" "$BIN/kvmem-bench" tools "${args[@]}" --wait 300 --ignore-eos \
  --rounds "$ROUNDS" --target-tokens $((CTX * 7 / 8)) --gen-tokens "$GEN" --out "$OUT" \
  > "$OUT/tools.txt" 2>&1
rc=$?
for pid in "${pids[@]}"; do kill "$pid"; done
wait
sed -n '/tool loop: what the turns waited for/,$p' "$OUT/tools.txt"
exit $rc
