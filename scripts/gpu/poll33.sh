#!/usr/bin/env bash
# Waits for scripts/gpu/grid33.sh running in the background (RES=/tmp/res, LOG=/tmp/grid.log)
# until it ends, a step fails or MAX_S pass; prints the progress and tars RES into $OUT.
#   bash poll33.sh [MAX_S]
RES=${RES:-/tmp/res}
MAX=${1:-500}
LOG=${LOG:-/tmp/grid.log}
t0=$(date +%s)
failed() { grep -E "rc=[1-9]" "$LOG" 2>/dev/null; }
while [ ! -f "$RES/ALL_DONE" ] && [ $(($(date +%s) - t0)) -lt "$MAX" ]; do
  sleep 5
done
uptime
nvidia-smi --query-gpu=name,utilization.gpu,memory.used --format=csv,noheader
echo "finished: $(grep -c 'rc=0' "$LOG") of $(grep -c '] start:' "$LOG") started steps"
grep -E "rc=|grid:" "$LOG"
for f in $(failed | sed 's/^\[\(.*\)\] .*/\1/'); do echo "== $f"; tail -15 "$RES/$f/progress.log"; done
for d in "$RES"/*/; do
  n=$(basename "$d")
  grep -q "^\[$n\] rc=" "$LOG" || echo "running $n: $(grep -c 'correct\|answer' "$d/progress.log" 2>/dev/null) lines, $(tail -c 160 "$d/progress.log" 2>/dev/null | tr '\n' ' ')"
done
cp "$LOG" "$RES/" 2>/dev/null
tar czf "$OUT/res.tgz" -C "$(dirname "$RES")" "$(basename "$RES")"
ls -la "$OUT"
